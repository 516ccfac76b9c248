"""One writer per workdir: `writer_lock` holds `<workdir>/train.lock` ({"host", "pid", "started",
"argv"}) while training; `check_trainable` says whether a workdir may be trained in. Locally the
file is also held with `fcntl.flock`, which the kernel drops when its process dies, so a stale
lock is taken over exactly; on a bucket (gs://) the file is advisory only.
"""

import contextlib
import datetime
import json
import os
import socket
import sys
from typing import Any, Iterator, Sequence

from absl import logging

from transformer import files
from transformer.config import ConfigError

LOCK_FILE = "train.lock"
# What a workdir may hold before its first run writes config.json (the sweep runner's files, the
# tokenizers a failed start may have copied in).
PRE_RUN_FILES = frozenset({LOCK_FILE, "sweep.log", "sweep_point.json", "tokenizers"})
# A workdir holds a run when it has checkpoints, or the config.json and provenance.json that a
# run writes together before its first checkpoint (the Reporter).
RUN_FILES = (("checkpoints",), ("config.json", "provenance.json"))


class WorkdirError(ConfigError):
  """A workdir that cannot be trained in now (one-line message)."""


def check_trainable(workdir: str, members: Sequence[str] = ()) -> None:
  """Raises WorkdirError if `workdir` holds files but no run (RUN_FILES); it may hold `members`,
  the directories of a train.members program's runs."""
  if not files.isdir(workdir):
    return
  names = files.listdir(workdir)
  if any(all(n in names for n in group) for group in RUN_FILES):
    return
  others = [n for n in names if n not in PRE_RUN_FILES and n not in members
            and not n.startswith((LOCK_FILE, ".write_probe."))]  # files.check_writable's probe
  if others:
    raise WorkdirError(f"--workdir={workdir} holds files but no run ({', '.join(others[:3])}"
                       f"{', ...' if len(others) > 3 else ''}); give a new or empty directory")


def _alive(pid: int) -> bool:
  if pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  return True


def _describe(holder: dict[str, Any]) -> str:
  return (f"process {holder.get('pid')} on {holder.get('host')} (since {holder.get('started')}, "
          f"{' '.join(holder.get('argv') or [])[:120]})")


def _read(path: str) -> dict[str, Any]:
  try:
    holder = json.loads(files.read_text(path))
  except (OSError, ValueError):
    return {}
  return holder if isinstance(holder, dict) else {}


def _refusal(path: str, holder: dict[str, Any], why: str) -> WorkdirError:
  return WorkdirError(f"{path}: the workdir is being trained by {_describe(holder)}{why}; one "
                      "writer per workdir")


@contextlib.contextmanager
def writer_lock(workdir: str) -> Iterator[None]:
  """Holds `<workdir>/train.lock`; WorkdirError if another live writer holds it. A local workdir
  this call created is removed again when the body raises before anything else was written there
  (a bad data path leaves no workdir behind)."""
  created = not files.exists(workdir)
  files.makedirs(workdir)
  path = os.path.join(workdir, LOCK_FILE)
  me = {"host": socket.gethostname(), "pid": os.getpid(),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]]}
  if files.is_local(path):
    import fcntl  # pylint: disable=g-import-not-at-top  (POSIX only; local workdirs)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    held = True
    with contextlib.suppress(BlockingIOError):
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      held = False
    if held:  # raised outside the except block: the refusal has no OSError in its context
      os.close(fd)
      raise _refusal(path, _read(path), "")
    try:
      holder = _read(path)
      if holder.get("host") not in (None, me["host"]):
        raise _refusal(path, holder, ", which cannot be checked from this host; delete the file "
                       "if no process writes there")
      if holder.get("pid") is not None:
        logging.warning("%s: took over the stale lock of %s, which is not running", path,
                        _describe(holder))
      os.ftruncate(fd, 0)
      os.write(fd, json.dumps(me).encode())
      os.fsync(fd)
      try:
        yield
      except BaseException:
        if created and os.listdir(workdir) == [LOCK_FILE]:  # removed while still held
          os.remove(path)
          os.rmdir(workdir)
        raise
      finally:
        # Released by emptying it: an empty lock file is nobody's. (Removing it would let a
        # process that opened the old file and one that creates a new one both hold "the" lock.)
        os.ftruncate(fd, 0)
    finally:
      os.close(fd)  # drops the flock
    return
  holder = _read(path) if files.exists(path) else {}
  if holder:
    if holder.get("host") != me["host"] or _alive(int(holder.get("pid") or 0)):
      raise _refusal(path, holder, " (an advisory lock on a bucket: delete it if no process "
                     "writes there)")
    logging.warning("%s: took over the stale lock of %s, which is not running", path,
                    _describe(holder))
  files.write_text_atomic(path, json.dumps(me))
  try:
    yield
  finally:
    if _read(path).get("pid") == me["pid"]:
      files.remove(path)
