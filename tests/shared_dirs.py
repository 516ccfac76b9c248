"""A directory made once per pytest invocation and shared by every test (and pytest-xdist worker)
that asks for it: the first caller makes it under a file lock in the directory all workers share
(the session's basetemp, or its parent under xdist, whose workers get popen-gwN subdirectories);
later callers, in any worker, reuse it. Tests read what is in it and never change it."""

import fcntl
import os
import pathlib
from typing import Callable


def shared_dir(tmp_path_factory, name: str, make: Callable[[pathlib.Path], None]) -> pathlib.Path:
  """`<shared>/<name>`, where `make(that directory)` has run once in this pytest invocation."""
  basetemp = tmp_path_factory.getbasetemp()
  root = (basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp) / name
  root.mkdir(exist_ok=True)
  with open(root / "lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (root / "done").exists():
      make(root)
      (root / "done").write_text("ok")
  return root
