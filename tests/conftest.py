"""Test-wide settings: the checkout's configs and the test helpers importable, CPU only,
deterministic, quiet, and quick to compile.

- Layout: tests/<part>/test_<module>.py tests transformer/<part>/<module>.py (a second aspect of a
  module in test_<module>_<aspect>.py); tests/test_<module>.py the package's top-level modules,
  the configs and the import graph; tests/e2e/ the command-line tools end to end; tests/docs/ the
  README, the records and the notebook; tests/benchmarks/ benchmarks/<name>.py. Without
  __init__.py files pytest imports each test file by its file name, so file names are unique
  across folders.
- The repository root goes first on sys.path and on PYTHONPATH (for the train.py / eval.py and
  `python -c` subprocesses the tests start): `configs/` is a directory of the checkout, not an
  installed package, and config files import each other as `configs.*`. tests/ itself, which
  holds the shared helpers (g2p_mini.py, synthetic_task.py, *_fixtures.py, ...), goes on sys.path
  too, so a test in any folder imports them by name.
- Most of the suite's time is XLA compiling many small programs, so the suite compiles at LLVM
  optimisation level 0 (the same programs, less optimised machine code; no test here measures
  speed, benchmarks/ do, at the default level) and shares one persistent compilation cache, fresh
  for each pytest run, between its tests, its xdist workers (they inherit the environment) and
  the subprocesses it starts, so a program that several tests build is compiled once. On
  tests/model/test_models_params.py + tests/train/test_steps.py (2-core x86_64 CPU) the two
  together cut the time by more than half. Set XLA_FLAGS or JAX_COMPILATION_CACHE_DIR yourself
  to override either.
"""

import atexit
import os
import shutil
import sys
import tempfile

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
for path in (TESTS, ROOT):
  if path not in sys.path:
    sys.path.insert(0, path)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (ROOT, *os.environ.get("PYTHONPATH", "").split(os.pathsep)) if p)

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_backend_optimization_level=0").strip()
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="transformer_tests_jax_cache_")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
