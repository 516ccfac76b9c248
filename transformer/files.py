"""Workdir file access on local paths and on bucket paths (`gs://...` through `etils.epath`; the
`tpu` extra installs gcsfs). Atomic writes rename a temporary sibling over the target (an object
upload is atomic by itself); a bucket object cannot be appended to, so `append_line` rewrites it.
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


def write_bytes_atomic(path: PathLike, data: bytes) -> None:
  """Writes `data` to `path` so that readers see the old or the new file, never half."""
  if not is_local(path):  # a bucket has no atomic rename
    epath.Path(path).write_bytes(data)
    return
  tmp = f"{os.fspath(path)}.tmp{os.getpid()}"  # per process: concurrent writers never collide
  epath.Path(tmp).write_bytes(data)
  os.replace(tmp, path)


def write_text_atomic(path: PathLike, text: str) -> None:
  """Writes `text` as UTF-8 to `path` so that readers see the old or the new file, never half."""
  write_bytes_atomic(path, text.encode("utf-8"))


def append_line(path: PathLike, line: str) -> None:
  """Appends `line` and a newline to the text file at `path` (created if missing)."""
  if is_local(path):
    with epath.Path(path).open("a") as f:
      f.write(line + "\n")
  else:  # objects cannot be appended to: rewrite the whole (small) file
    old = read_text(path) if exists(path) else ""
    write_text_atomic(path, old + line + "\n")


def check_writable(path: PathLike) -> None:
  """Raises OSError (errno, `path`) unless a file can be created in directory `path` (or its
  nearest existing parent), so a read-only file system, full quota or missing permission shows
  at once, not after a run's first save retried for minutes. Bucket paths are not checked."""
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
