"""benchmarks/<name>.py imported as a module in tests (benchmarks/ is not a package)."""

import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_benchmark(name: str):
  """The module benchmarks/<name>.py, freshly executed."""
  spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "benchmarks", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
