"""The `transformer` package's imports point one way (the README's Layout; an arrow is an import):
scaling -> sweeps -> train -> infer -> run -> data, model -> the shared modules (choices, keyspec,
schema, config, metrics); convert -> train; infer never imports train, model code never imports
data, training or I/O code.

Every module's imports are read with `ast`, function-level ones included, into a graph of
`transformer.*` modules; `importlib.import_module("transformer.x")` and `__import__(...)` with a
literal name (or an f-string's literal head, `f"transformer.x.{name}"`) count as imports too. The
one exception is the package facade transformer/__init__.py, whose lazy `_EXPORTS` table names
modules of every part: it is the top of the house. The tests fail on any cycle, on an arrow
between sub-packages that PACKAGE_MAY_IMPORT does not allow, and on the library importing the
top-level `configs` package.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "transformer"
# What each part of the package may import besides itself: a top-level module is its own part
# (transformer.cli's lazy import of the model sizes an out-of-memory message).
SHARED = {"transformer.choices", "transformer.keyspec", "transformer.schema",
          "transformer.config", "transformer.metrics"}
PACKAGE_MAY_IMPORT = {
    "shared": SHARED,
    "transformer.files": set(),
    "transformer.model": SHARED,
    "transformer.cli": SHARED | {"transformer.model"},
    "transformer.data": SHARED | {"transformer.files"},
    # compare's command line parses its flags and words its errors as every command does (cli).
    "transformer.run": SHARED | {"transformer.files", "transformer.model", "transformer.data",
                                 "transformer.cli"},
    "transformer.infer": SHARED | {"transformer.files", "transformer.model", "transformer.data",
                                   "transformer.run", "transformer.cli"},
}
PACKAGE_MAY_IMPORT["transformer.train"] = PACKAGE_MAY_IMPORT["transformer.infer"] | {
    "transformer.infer"}
PACKAGE_MAY_IMPORT["transformer.sweeps"] = PACKAGE_MAY_IMPORT["transformer.train"] | {
    "transformer.train"}
PACKAGE_MAY_IMPORT["transformer.convert"] = PACKAGE_MAY_IMPORT["transformer.sweeps"] - {
    "transformer.infer"}
# Scaling laws read runs (run.compare), count models (model, run's MFU count) and plan sweeps.
PACKAGE_MAY_IMPORT["transformer.scaling"] = PACKAGE_MAY_IMPORT["transformer.sweeps"] | {
    "transformer.sweeps"}
# Whose string imports are not arrows: the package facade's lazy _EXPORTS (it is the top).
STRING_IMPORTS_ALLOWED = {"transformer"}


def part(module: str) -> str:
  """transformer.model.layers -> transformer.model; a shared top-level module -> 'shared'."""
  if module in SHARED:
    return "shared"
  return ".".join(module.split(".")[:2])


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def string_import(node: ast.AST) -> str | None:
  """The module a call `importlib.import_module("a.b")`, `import_module(...)` or `__import__(...)`
  names by a literal string (an f-string: its literal head up to the last dot), else None."""
  if not isinstance(node, ast.Call) or not node.args:
    return None
  func = node.func
  called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
  if called not in ("import_module", "__import__"):
    return None
  arg = node.args[0]
  if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
    return arg.value
  if (isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant)
      and "." in arg.values[0].value):
    return arg.values[0].value.rpartition(".")[0]
  return None


def imported_modules(path: pathlib.Path, modules: frozenset[str] = frozenset()) -> set[str]:
  """Every module `path` imports, at any depth (function-level imports too), as dotted names;
  `from a import b` counts as a.b when a.b is in `modules`, else as a; string imports
  (`string_import`) count except in STRING_IMPORTS_ALLOWED."""
  name = module_name(path)
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  found = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if (target := string_import(node)) and name not in STRING_IMPORTS_ALLOWED:
      found.add(target)
    elif isinstance(node, ast.Import):
      found |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative: from . import x, from .y import z
        anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        base = f"{anchor}.{base}" if base else anchor
      found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                for a in node.names}
  return found


def package_graph() -> dict[str, set[str]]:
  """transformer module -> the transformer modules it imports."""
  modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
  graph = {}
  for name, path in modules.items():
    deps = {d for d in imported_modules(path, frozenset(modules)) if d in modules and d != name}
    # `import transformer.x` runs transformer/__init__.py, which imports nothing eagerly.
    graph[name] = deps - {"transformer"}
  return graph


def test_the_package_init_imports_nothing_eagerly():
  """What lets package_graph leave out the arrows into transformer/__init__.py."""
  assert package_graph()["transformer"] <= {"transformer"}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle of `graph` as [a, b, ..., a], or None (depth-first search, three colours)."""
  state: dict[str, int] = {}  # 1: on the current path, 2: done
  path: list[str] = []

  def visit(node):
    state[node] = 1
    path.append(node)
    for dep in sorted(graph.get(node, ())):
      if state.get(dep) == 1:
        return path[path.index(dep):] + [dep]
      if dep not in state and (cycle := visit(dep)):
        return cycle
    path.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state and (cycle := visit(node)):
      return cycle
  return None


def test_find_cycle_finds_a_synthetic_cycle_and_passes_a_dag():
  """The checker can fail: a three-module cycle (function-level imports hide such ones) is
  reported; the same graph with one arrow reversed passes."""
  cyclic = {"training": {"steps", "evaluation"}, "evaluation": {"training"}, "steps": set()}
  assert find_cycle(cyclic) == ["evaluation", "training", "evaluation"]
  assert find_cycle({"training": {"steps", "evaluation"}, "evaluation": {"steps"},
                     "steps": set()}) is None


def test_function_level_imports_are_read(tmp_path, monkeypatch):
  """An import inside a function counts like one at the top."""
  monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path)
  (tmp_path / "a.py").write_text("def f():\n  from tmp import b  # hidden\n")
  assert imported_modules(tmp_path / "a.py", frozenset({"tmp.b"})) == {"tmp.b"}
  assert imported_modules(tmp_path / "a.py") == {"tmp"}


def test_no_import_cycles_in_the_package():
  cycle = find_cycle(package_graph())
  assert cycle is None, " -> ".join(cycle)


def test_library_never_imports_the_configs_package():
  offenders = {m for m, p in ((module_name(p), p) for p in PACKAGE.rglob("*.py"))
               if any(d == "configs" or d.startswith("configs.") for d in imported_modules(p))}
  assert not offenders, f"take the defaults from transformer.schema.get_config instead: {offenders}"


def test_string_imports_are_read(tmp_path, monkeypatch):
  """importlib.import_module / __import__ of a literal name, or of an f-string's literal package,
  is an arrow like an import statement."""
  monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path)
  (tmp_path / "a.py").write_text(
      "import importlib\nfrom importlib import import_module\n"
      "def f(x):\n  importlib.import_module('tmp.b')\n  import_module(f'tmp.c.{x}')\n"
      "  __import__('tmp.d')\n  importlib.import_module(x)\n")
  assert imported_modules(tmp_path / "a.py") == {"importlib", "tmp.b", "tmp.c", "tmp.d"}


def test_sub_packages_import_only_downward():
  """Every arrow between parts of the package is one PACKAGE_MAY_IMPORT allows."""
  wrong = sorted(f"{m} -> {d}" for m, deps in package_graph().items() for d in deps
                 if part(d) != part(m) and not {d, part(d)} & PACKAGE_MAY_IMPORT[part(m)])
  assert not wrong, wrong


def test_every_module_belongs_to_a_known_part():
  assert {part(m) for m in package_graph()} - {"transformer"} <= set(PACKAGE_MAY_IMPORT)


def test_the_arrow_checker_can_fail(monkeypatch):
  """An upward arrow (infer -> train) is reported."""
  graph = {"transformer.infer.api": {"transformer.train.steps"}, "transformer.train.steps": set()}
  monkeypatch.setattr(__import__(__name__), "package_graph", lambda: graph)
  with pytest.raises(AssertionError, match="infer.api -> transformer.train.steps"):
    test_sub_packages_import_only_downward()
