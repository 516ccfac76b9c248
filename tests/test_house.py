"""The house's size limits (the developers' guide): no module of transformer/ over 400 lines, no
function over 60. A function's length is its own lines: a function or class defined inside it (a
factory's class, a step's inner function) is measured on its own, each of its methods as a
function. OVER_LIMIT names the modules still over, at their length: it may only shrink, and an
entry is removed once its module fits."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "transformer"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# Modules over MAX_MODULE_LINES and their line counts (to be split, never to grow): none.
OVER_LIMIT: dict[str, int] = {}


def module_lines(path: pathlib.Path) -> int:
  return len(path.read_text().splitlines())


def own_lines(node: ast.AST) -> int:
  """The lines of a function less those of the functions and classes defined inside it."""
  inner = [n for n in ast.walk(node) if n is not node
           and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
  outermost = [n for n in inner
               if not any(o is not n and o.lineno <= n.lineno and n.end_lineno <= o.end_lineno
                          for o in inner)]
  return node.end_lineno - node.lineno + 1 - sum(n.end_lineno - n.lineno + 1 for n in outermost)


def long_functions(source: str, name: str) -> list[str]:
  """'name:line function (N lines)' for each function of `source` over MAX_FUNCTION_LINES."""
  return [f"{name}:{n.lineno} {n.name} ({own_lines(n)} lines)"
          for n in ast.walk(ast.parse(source))
          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
          and own_lines(n) > MAX_FUNCTION_LINES]


def module_problems(sizes: dict[str, int], allowed: dict[str, int]) -> list[str]:
  """Modules of `sizes` over MAX_MODULE_LINES beyond `allowed`; `allowed` entries that fit."""
  grown = [f"{m} ({n} lines): split it" for m, n in sorted(sizes.items())
           if n > max(MAX_MODULE_LINES, allowed.get(m, 0))]
  return grown + [f"{m} fits now: take it out of OVER_LIMIT" for m in sorted(allowed)
                  if sizes.get(m, 0) <= MAX_MODULE_LINES]


def test_no_module_over_400_lines():
  sizes = {str(p.relative_to(PACKAGE)): module_lines(p) for p in PACKAGE.rglob("*.py")}
  assert not module_problems(sizes, OVER_LIMIT)


def test_no_function_over_60_lines():
  found = [f for p in sorted(PACKAGE.rglob("*.py"))
           for f in long_functions(p.read_text(), str(p.relative_to(PACKAGE)))]
  assert not found, found


def test_the_checks_can_fail():
  """A 61-line function is reported (inside another function too), a factory's nested class is
  measured method by method; a module over the limit, or grown past its allowance, is reported,
  and an allowance no longer needed."""
  body = "".join(f"  x{i} = {i}\n" for i in range(60))
  assert long_functions(f"def f():\n{body}", "m") == ["m:1 f (61 lines)"]
  assert long_functions(f"def f():\n  def g():\n{body.replace('  ', '    ')}  return g\n",
                        "m") == ["m:2 g (61 lines)"]
  factory = "def make():\n  class C:\n" + "".join(
      f"    def m{i}(self):\n      return {i}\n" for i in range(40)) + "  return C\n"
  assert long_functions(factory, "m") == []
  assert module_problems({"a.py": 401, "b.py": 400, "c.py": 470}, {"c.py": 473}) == [
      "a.py (401 lines): split it"]
  assert module_problems({"c.py": 474}, {"c.py": 473}) == ["c.py (474 lines): split it"]
  assert module_problems({"c.py": 390}, {"c.py": 473}) == [
      "c.py fits now: take it out of OVER_LIMIT"]
