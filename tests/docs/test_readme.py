"""The README's marked code blocks run as written.

A fenced block whose preceding line is `<!-- test: fast -->` runs in the default test run,
`<!-- test: slow -->` under `-m slow`; unmarked blocks are not run here (installs, cloud
commands, long trainings: `benchmarks/reproduce.py` reruns the cheap documented results, and
tests/docs/test_results_table.py checks the README's results table against the records). Each
block runs on its own (bash, or a fresh `python`), in a scratch directory that links the
checkout's top-level files, with its own HOME and TFDS data directory; `runs/g2p_tiny` there is
the trained mini run (tests/g2p_mini.py), a stand-in for the quickstart's run.
"""

import os
import re
import subprocess
import sys

import pytest

import g2p_mini

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(REPO, "README.md")
MARK = re.compile(r"^<!-- test: (\w+) -->$", re.MULTILINE)  # a line of its own
FENCE = re.compile(r"^```(\w*)\s*$")
RUNNERS = {"bash": ["bash", "-e", "-o", "pipefail", "-c"], "python": [sys.executable, "-c"]}


def marked_blocks(text):
  """(line of the fence, mark, language, code) of every fenced block, marked or not (mark '')."""
  lines, blocks, i = text.split("\n"), [], 0
  while i < len(lines):
    fence = FENCE.match(lines[i])
    if not fence or not fence.group(1):
      i += 1
      continue
    end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
    previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
    mark = MARK.fullmatch(previous)
    blocks.append((i + 1, mark.group(1) if mark else "", fence.group(1),
                   "\n".join(lines[i + 1:end])))
    i = end + 1
  return blocks


with open(README, encoding="utf-8") as f:
  BLOCKS = [b for b in marked_blocks(f.read()) if b[1]]


def test_block_marks_are_known_and_on_runnable_blocks():
  """Every mark is `fast` or `slow`, sits right above a bash or python fence, and the README has
  fast blocks (a mark with a typo or on a prose line would silently test nothing)."""
  with open(README, encoding="utf-8") as f:
    text = f.read()
  assert len(MARK.findall(text)) == len(BLOCKS)
  assert {mark for _, mark, _, _ in BLOCKS} <= {"fast", "slow"}
  assert {lang for _, _, lang, _ in BLOCKS} <= set(RUNNERS)
  assert any(mark == "fast" for _, mark, _, _ in BLOCKS)


@pytest.mark.parametrize("line,mark,lang,code", [
    pytest.param(*b, id=f"README.md:{b[0]}", marks=[pytest.mark.slow] if b[1] == "slow" else [])
    for b in BLOCKS])
def test_readme_block_runs(line, mark, lang, code, tmp_path, tmp_path_factory):
  """The block exits 0 in a scratch checkout (links to the repository's top-level entries, its
  own HOME and TFDS data directory, `runs/g2p_tiny` the trained mini run)."""
  del mark
  for name in os.listdir(REPO):
    if name not in (".git", "runs", ".venv"):
      (tmp_path / name).symlink_to(os.path.join(REPO, name))
  (tmp_path / "runs").mkdir()
  if "runs/g2p_tiny" in code:
    (tmp_path / "runs" / "g2p_tiny").symlink_to(g2p_mini.trained_run(tmp_path_factory))
  (tmp_path / "home").mkdir()
  env = os.environ | {"HOME": str(tmp_path / "home"), "TFDS_DATA_DIR": str(tmp_path / "tfds"),
                      "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu", "MPLBACKEND": "Agg"}
  proc = subprocess.run([*RUNNERS[lang], code], cwd=tmp_path, env=env, capture_output=True,
                        text=True, timeout=600, check=False)
  assert proc.returncode == 0, f"README.md:{line} ({lang}) failed:\n{proc.stderr[-3000:]}"

