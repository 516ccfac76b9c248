"""The README's Layout section matches the tree: every sub-package and top-level module of
transformer/ is named there, and every file or folder it names exists."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def layout_block() -> str:
  text = (ROOT / "README.md").read_text()
  section = text[text.index("## Layout"):]
  return section[section.index("```") + 3:section.index("```", section.index("```") + 3)]


def test_every_part_of_the_package_is_named():
  block = layout_block()
  package = ROOT / "transformer"
  parts = {f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").exists()}
  parts |= {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
  missing = sorted(p for p in parts if not re.search(rf"(?<![\w/]){re.escape(p)}", block))
  assert not missing, f"README Layout does not name {missing}"


def test_every_named_path_exists():
  block = layout_block()
  top = [line.split()[0] for line in block.splitlines() if line and not line.startswith(" ")]
  names = [n for entry in top for n in entry.rstrip(",").split(",") if n]
  inside = [n for line in block.splitlines() if line.startswith("  ")
            for n in line.split("   ")[0].split() if n.endswith((".py", "/"))]
  missing = [n for n in names if not (ROOT / n.strip()).exists()]
  missing += [n for n in inside if not (ROOT / "transformer" / n).exists()]
  assert not missing, f"README Layout names paths that do not exist: {missing}"
