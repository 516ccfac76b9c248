"""Test-wide settings: the checkout's configs importable, CPU only, deterministic, quiet, and
quick to compile.

- The repository root goes first on sys.path and on PYTHONPATH (for the train.py / eval.py and
  `python -c` subprocesses the tests start): `configs/` is a directory of the checkout, not an
  installed package, and config files import each other as `configs.*`.
- Most of the suite's time is XLA compiling many small programs, so the suite compiles at LLVM
  optimisation level 0 (the same programs, less optimised machine code; no test here measures
  speed, benchmarks/ do, at the default level) and shares one persistent compilation cache, fresh
  for each pytest run, between its tests, its xdist workers (they inherit the environment) and
  the subprocesses it starts, so a program that several tests build is compiled once. On
  tests/test_models_params.py + tests/test_steps.py (2-core x86_64 CPU) the two together cut
  the time by more than half. Set XLA_FLAGS or JAX_COMPILATION_CACHE_DIR yourself to override
  either.
"""

import atexit
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
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
