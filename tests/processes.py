"""Subprocesses of the multi-process tests (tests/train/test_parallel.py,
tests/data/test_stream.py): a free loopback port for `jax.distributed`, and their JSON results
collected under one deadline."""

import json
from pathlib import Path
import socket
import subprocess
import time


def collect(procs: list[subprocess.Popen], out_dir: Path, timeout: float) -> list[dict]:
  """Waits for all (killing every one of them on timeout); returns each one's JSON result.

  Process `python FILE *args` wrote its stdout to out_dir/<args joined by _>.out (the result: its
  last line) and its stderr to the same name with .err."""
  deadline = time.monotonic() + timeout
  try:
    for p in procs:
      p.wait(timeout=max(1.0, deadline - time.monotonic()))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  results = []
  for p in procs:
    name = "_".join(p.args[2:])
    err = (out_dir / f"{name}.err").read_text()
    assert p.returncode == 0, f"subprocess {name} exited with {p.returncode}:\n{err[-4000:]}"
    results.append(json.loads((out_dir / f"{name}.out").read_text().strip().splitlines()[-1]))
  return results


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]
