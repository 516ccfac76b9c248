"""Workdir file access on local paths and on bucket paths (`gs://...`), through `etils.epath`.

Every file we write into a run's workdir (or read back from one) goes through these helpers, so a
workdir (and `data.data_dir`) may be a local directory or a bucket path. Local paths behave as plain
`open`/`os.*` did. Bucket paths need a backend: `pip install -e ".[tpu]"` installs gcsfs, which
epath reaches through fsspec (and google-cloud-storage, which tensorboardX uses for its events).

Writes: a local file is written to a temporary sibling and renamed over the target, so a reader
never sees half a file. Object stores have no atomic rename, but an upload is atomic (readers see
the old object or the new one), so on them the object is written directly.
Appends: objects cannot be appended to, so `append_line` on a bucket reads the object and writes
it back with the line added: one read and one write of the file per line. That is fine for what
we append (metrics.jsonl: one line per logged step, some hundred KB over a long run).
"""

import errno
import os

from etils import epath

PathLike = str | os.PathLike


def is_local(path: PathLike) -> bool:
  """True for a file-system path, False for a URI such as gs://bucket/dir."""
  return "://" not in os.fspath(path)


def exists(path: PathLike) -> bool:
  """Whether a file or directory exists at `path`."""
  return epath.Path(path).exists()


def isdir(path: PathLike) -> bool:
  """Whether `path` is a directory (on a bucket: a prefix with objects under it)."""
  return epath.Path(path).is_dir()


def makedirs(path: PathLike) -> None:
  """Creates `path` and its parents if missing."""
  epath.Path(path).mkdir(parents=True, exist_ok=True)


def listdir(path: PathLike) -> list[str]:
  """The names (not paths) of the entries of directory `path`, sorted."""
  return sorted(p.name for p in epath.Path(path).iterdir())


def walk(path: PathLike) -> list[str]:
  """Every file under directory `path`, as '/'-joined paths relative to it, sorted."""
  out, todo = [], [(epath.Path(path), "")]
  while todo:
    directory, prefix = todo.pop()
    for entry in directory.iterdir():
      if entry.is_dir():
        todo.append((entry, f"{prefix}{entry.name}/"))
      else:
        out.append(prefix + entry.name)
  return sorted(out)


def rename(path: PathLike, new: PathLike) -> None:
  """Renames a file or directory (on a bucket: a copy and a delete, not atomic)."""
  epath.Path(path).rename(new)


def size(path: PathLike) -> int:
  """The size in bytes of the file at `path`."""
  return epath.Path(path).stat().length


def open_binary(path: PathLike):
  """The file at `path` opened for reading bytes."""
  return epath.Path(path).open("rb")


def remove(path: PathLike) -> None:
  """Deletes the file at `path`."""
  epath.Path(path).unlink()


def read_text(path: PathLike) -> str:
  """The UTF-8 text of the file at `path`."""
  return epath.Path(path).read_text(encoding="utf-8")


def read_bytes(path: PathLike) -> bytes:
  """The bytes of the file at `path`."""
  return epath.Path(path).read_bytes()


def _write_atomic(path: PathLike, data: str | bytes) -> None:
  mode = "wb" if isinstance(data, bytes) else "w"
  if not is_local(path):  # an object upload is atomic; a bucket has no atomic rename
    with epath.Path(path).open(mode) as f:
      f.write(data)
    return
  tmp = f"{os.fspath(path)}.tmp{os.getpid()}"  # per process: concurrent writers never collide
  with epath.Path(tmp).open(mode) as f:
    f.write(data)
  os.replace(tmp, path)


def write_text_atomic(path: PathLike, text: str) -> None:
  """Writes UTF-8 `text` to `path` so that readers see the old or the new file, never half."""
  _write_atomic(path, text)


def write_bytes_atomic(path: PathLike, data: bytes) -> None:
  """Writes `data` to `path` so that readers see the old or the new file, never half."""
  _write_atomic(path, data)


def append_line(path: PathLike, line: str) -> None:
  """Appends `line` and a newline to the text file at `path` (created if missing)."""
  if is_local(path):
    with epath.Path(path).open("a") as f:
      f.write(line + "\n")
  else:  # objects cannot be appended to: rewrite the whole (small) file
    old = read_text(path) if exists(path) else ""
    write_text_atomic(path, old + line + "\n")


def check_writable(path: PathLike) -> None:
  """Raises OSError (errno, `path`) unless files can be created in directory `path` (or, if it
  does not exist yet, in its nearest existing parent): by creating and deleting one, so that a
  read-only file system, a full quota or missing permissions show at once, not after a run's
  first save retried for minutes. Bucket paths are not checked (no cheap probe)."""
  if not is_local(path):
    return
  directory = os.path.abspath(os.fspath(path))
  while not os.path.exists(directory):
    directory = os.path.dirname(directory)
  if not os.path.isdir(directory):
    raise NotADirectoryError(errno.ENOTDIR, "not a directory", directory)
  probe = os.path.join(directory, f".write_probe.{os.getpid()}")
  try:
    os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
  except OSError as e:
    raise OSError(e.errno, e.strerror, directory) from None
  os.remove(probe)
