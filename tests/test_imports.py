"""The `transformer` package's imports point one way: configs -> config -> model, data, optim ->
steps -> training and evaluation -> the entry points (the README's Layout).

Every module's imports are read with `ast`, function-level ones included, into a graph of
`transformer.*` modules; the tests fail on any cycle, on the library importing the top-level
`configs` package, and on model code importing data, training or I/O code.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "transformer"
MODEL_CODE = ("attention", "positional", "layers", "heads", "models", "kv_cache", "kernels")
# What model code may import from the package: other model code and the config dataclasses.
MODEL_CODE_MAY_IMPORT = {f"transformer.{m}" for m in MODEL_CODE} | {"transformer.config"}


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: pathlib.Path, modules: frozenset[str] = frozenset()) -> set[str]:
  """Every module `path` imports, at any depth (function-level imports too), as dotted names;
  `from a import b` counts as a.b when a.b is in `modules`, else as a."""
  name = module_name(path)
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  found = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
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


@pytest.mark.parametrize("name", MODEL_CODE)
def test_model_code_imports_no_data_training_or_io(name):
  path = PACKAGE / f"{name}.py"
  if not path.exists():  # kv_cache.py arrives with the attention redesign
    pytest.skip(f"{path} does not exist")
  inside = package_graph()[f"transformer.{name}"]
  assert inside <= MODEL_CODE_MAY_IMPORT, sorted(inside - MODEL_CODE_MAY_IMPORT)


def test_steps_training_evaluation_arrows():
  """steps imports neither loop; training imports evaluation, never the reverse."""
  graph = package_graph()
  assert not graph["transformer.train.steps"] & {"transformer.train.loop", "transformer.infer.evaluation"}
  assert "transformer.train.loop" not in graph["transformer.infer.evaluation"]
