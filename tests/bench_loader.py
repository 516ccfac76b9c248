"""benchmarks/<name>.py imported as a module in tests (benchmarks/ is not a package)."""

import importlib.util
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(REPO, "benchmarks")


def load_benchmark(name: str):
  """The module benchmarks/<name>.py, freshly executed, with benchmarks/ on sys.path for the
  sibling modules it imports (trees, commands, train_step), as when it runs as a script."""
  if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)
  spec = importlib.util.spec_from_file_location(name, os.path.join(BENCHMARKS, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
