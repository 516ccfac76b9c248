"""Test-wide settings: CPU only, deterministic, quiet, and quick to compile.

Most of the suite's time is XLA compiling many small programs, so the suite
- compiles at LLVM optimisation level 0: the same programs (HLO), less optimised machine code; no
  test here measures speed (benchmarks/ do, at the default level);
- shares one persistent compilation cache, fresh for each pytest run, between its tests, its
  xdist workers (they inherit the environment) and the train.py / eval.py subprocesses it starts,
  so a program that several tests build is compiled once.
tests/test_models_params.py + tests/test_steps.py on a 2-core CPU VM: 183 s as before, 94 s at
level 0, 77 s with the cache as well. Set XLA_FLAGS or JAX_COMPILATION_CACHE_DIR yourself to
override either.
"""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_backend_optimization_level=0").strip()
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="transformer_tests_jax_cache_")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
