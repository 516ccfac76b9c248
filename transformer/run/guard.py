"""The one guard every writer goes through (train's workdir, eval.py --out, sweep's workdir,
compare --plot): a command writes a run's workdir, or anything inside one, only when it owns that
run (train and eval.py their --workdir); and it replaces a file only when it wrote that file
itself (`--overwrite` where a command has one). What a command wrote outside a run is recorded
beside it in RECORD (file name -> sha256): a file of that name whose bytes are still the recorded
ones is its own; any other file is the user's and is never replaced.
"""

import hashlib
import json
import os
from typing import Sequence

from transformer import files
from transformer.run import lock

RECORD = ".written.json"


class WriteRefused(ValueError):
  """A path a command may not write (one-line message naming the flag and the path)."""


def _holds_run(directory: str) -> bool:
  names = set(files.listdir(directory)) if files.isdir(directory) else set()
  return any(all(n in names for n in group) for group in lock.RUN_FILES)


def enclosing_run(path: str) -> str | None:
  """The workdir of the run that `path` is or lies inside (the nearest such directory), or None;
  local paths only (a bucket path: None)."""
  if not files.is_local(path):
    return None
  current = os.path.realpath(path)
  while True:
    if _holds_run(current):
      return current
    parent = os.path.dirname(current)
    if parent == current:
      return None
    current = parent


def _same(a: str, b: str) -> bool:
  return os.path.realpath(a) == os.path.realpath(b)


def _record(directory: str) -> dict[str, str]:
  try:
    record = json.loads(files.read_text(os.path.join(directory, RECORD)))
  except (OSError, ValueError):
    return {}
  return record if isinstance(record, dict) else {}


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with files.open_binary(path) as f:
    while chunk := f.read(1 << 22):
      digest.update(chunk)
  return digest.hexdigest()


def foreign_files(directory: str, names: Sequence[str]) -> list[str]:
  """Those of `names` that exist in `directory` and are not files a command wrote there (their
  bytes are not the ones RECORD holds)."""
  record = _record(directory) if files.isdir(directory) else {}
  return [n for n in names if files.exists(path := os.path.join(directory, n))
          and (files.isdir(path) or record.get(n) != _sha256(path))]


def check(target: str, flag: str, names: Sequence[str] = (), own: str | None = None,
          overwrite: bool = False, is_file: bool = False, hint: str = "") -> None:
  """Raises WriteRefused unless a command may write `names` into directory `target` (or, with
  `is_file`, the file `target`), which `flag` named: never a directory that is a file, never a run's
  workdir or inside one but the run `own` (the command's, written at its root), never a file of
  `names` it did not write unless `overwrite` (`hint`: how this command says so)."""
  directory = os.path.dirname(os.path.abspath(target)) if is_file else target
  names = [os.path.basename(target)] if is_file else list(names)
  if files.exists(directory) and not files.isdir(directory):
    raise WriteRefused(f"{flag}={target}: {directory} is a file, not a directory")
  if is_file and files.isdir(target):
    raise WriteRefused(f"{flag}={target} is a directory: name a file")
  run = enclosing_run(directory)
  if run is not None and not (own is not None and _same(run, own) and _same(directory, own)):
    where = ("is the workdir of a run" if not is_file and _same(run, directory)
             else f"is inside the run {run}")
    raise WriteRefused(f"{flag}={target} {where}: only that run's own commands write there; "
                       "give a directory outside it")
  if run is None and not overwrite and (held := foreign_files(directory, names)):
    raise WriteRefused(f"{flag}={target}: {', '.join(os.path.join(directory, n) for n in held)} "
                       f"{'exist and were' if len(held) > 1 else 'exists and was'} not written "
                       "here by this command; give a new "
                       f"{'file' if is_file else 'directory'}{hint}")


def write_bytes(directory: str, name: str, data: bytes) -> None:
  """Writes `data` to `directory`/`name` atomically and, outside a run's workdir, records it in
  RECORD as written by a command (so that the next write may replace it)."""
  files.makedirs(directory)
  files.write_bytes_atomic(os.path.join(directory, name), data)
  if enclosing_run(directory) is None:
    record = _record(directory) | {name: hashlib.sha256(data).hexdigest()}
    files.write_text_atomic(os.path.join(directory, RECORD), json.dumps(record, indent=1,
                                                                       sort_keys=True))
