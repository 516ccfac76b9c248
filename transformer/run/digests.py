"""Checksums of checkpoints, `<step>/digest.json` ({"algorithm", "files": {path: hex digest}}),
and of the tokenizer files a step was trained with. `verify_step` fails a changed or missing
file, or a missing digest.json.
"""

import concurrent.futures
import hashlib
import json
import os
import zlib
from typing import Any, Mapping

from transformer import files


class CheckpointError(ValueError):
  """A checkpoint that cannot be used with this config (one-line message)."""


DIGEST_FILE = "digest.json"
# Step files: CRC-32 (fast; catches corruption, not tampering); tokenizer files: BLAKE2b-256.
DIGEST_ALGORITHM = "crc32"
CORRUPT_SUFFIX = ".corrupt"
# What orbax's CheckpointManager reads of every step when it opens a directory (commit time, metrics).
ORBAX_LISTING_FILES = ("_CHECKPOINT_METADATA", "metrics/metrics")
_CHUNK = 1 << 22
_BLOCK = 1 << 26  # crc32 digests: one CRC per 64 MiB of a file, the blocks hashed in parallel


def _crc32(path: str, start: int, length: int) -> str:
  """The CRC-32 (8 hex digits) of `length` bytes of a file from `start`."""
  crc = 0
  with files.open_binary(path) as f:
    f.seek(start)
    while length > 0 and (chunk := f.read(min(_CHUNK, length))):
      crc = zlib.crc32(chunk, crc)
      length -= len(chunk)
  return f"{crc:08x}"


def file_digest(path: str) -> str:
  """The BLAKE2b-256 hex digest of the file at `path`."""
  digest = hashlib.blake2b(digest_size=32)
  with files.open_binary(path) as f:
    while chunk := f.read(_CHUNK):
      digest.update(chunk)
  return digest.hexdigest()


def tree_digests(directory: str, names: list[str] | None = None,
                 algorithm: str = "blake2b-256") -> dict[str, str]:
  """{relative path: hex digest} of `names` (default: every file) under `directory`, hashed in
  threads; crc32: one per _BLOCK bytes, joined by commas, so one large file uses every core."""
  names = files.walk(directory) if names is None else names
  paths = [os.path.join(directory, n) for n in names]
  with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
    if algorithm != "crc32":
      return dict(zip(names, pool.map(file_digest, paths)))
    blocks = [(n, p, b) for n, p in zip(names, paths)
              for b in range(0, max(files.size(p), 1), _BLOCK)]
    out: dict[str, list[str]] = {n: [] for n in names}
    for (n, _, _), crc in zip(blocks, pool.map(lambda nb: _crc32(nb[1], nb[2], _BLOCK), blocks)):
      out[n].append(crc)
  return {n: ",".join(c) for n, c in out.items()}


def write_step_digest(step_dir: str) -> None:
  """Writes `<step_dir>/digest.json`: the digest of every file of the committed step, and the
  step's directory name (a step directory renamed to another number then fails verification)."""
  names = [n for n in files.walk(step_dir) if not n.startswith(DIGEST_FILE)]
  record = {"algorithm": DIGEST_ALGORITHM, "files": tree_digests(step_dir, names, DIGEST_ALGORITHM),
            "step": os.path.basename(os.path.normpath(step_dir))}
  files.write_text_atomic(os.path.join(step_dir, DIGEST_FILE),
                          json.dumps(record, indent=0, sort_keys=True))


def read_step_meta(step_dir: str) -> dict[str, Any] | None:
  """The `meta` item of a step read as plain JSON, or None if unreadable."""
  try:
    meta = json.loads(files.read_text(os.path.join(step_dir, "meta", "metadata")))
  except (OSError, ValueError):
    return None
  return meta if isinstance(meta, dict) else None


def _is_array_data(name: str) -> bool:
  """True for a file of orbax's array data (`<item>/d/...`, `<item>/ocdbt.process_<i>/d/...`)."""
  return "/d/" in f"/{name}"


def _orbax_json_parses(step_dir: str) -> str | None:
  """None if the JSON files orbax reads when it lists a step parse (or are absent), else which."""
  for name in ORBAX_LISTING_FILES:
    try:
      json.loads(files.read_text(os.path.join(step_dir, name)))
    except FileNotFoundError:
      continue
    except (OSError, ValueError):
      return f"{name} is not readable JSON"
  return None


def verify_step(step_dir: str, metadata_only: bool = False) -> str | None:
  """None if the step's files match its digest.json, else why not. `metadata_only`: only the
  small files orbax reads to list and open a step (all but the array data), cheap for every step;
  a step without digest.json then passes if the JSON files orbax lists it by parse."""
  path = os.path.join(step_dir, DIGEST_FILE)
  if not files.exists(path):
    return _orbax_json_parses(step_dir) if metadata_only else f"no {DIGEST_FILE}"
  try:
    record = json.loads(files.read_text(path))
    expected, algorithm = dict(record["files"]), record["algorithm"]
  except (OSError, ValueError, KeyError, TypeError):
    return f"{DIGEST_FILE} is unreadable"
  if algorithm not in ("crc32", "blake2b-256"):
    return f"{DIGEST_FILE} names an unknown algorithm {algorithm!r}"
  name = os.path.basename(os.path.normpath(step_dir))
  if record.get("step", name) != name:
    return f"{DIGEST_FILE} was written for step {record['step']} (the directory was renamed)"
  if metadata_only:
    expected = {n: d for n, d in expected.items() if not _is_array_data(n)}
  missing = [n for n in expected if not files.exists(os.path.join(step_dir, n))]
  if missing:
    return f"{missing[0]} is missing"
  actual = tree_digests(step_dir, sorted(expected), algorithm)
  changed = [n for n in expected if actual[n] != expected[n]]
  return f"{changed[0]} does not match its digest" if changed else None


def tokenizer_digests(workdir: str) -> dict[str, str]:
  """{'tokenizers/<side>/<file>': digest} of the workdir's tokenizer files ({} if none)."""
  directory = os.path.join(workdir, "tokenizers")
  if not files.isdir(directory):
    return {}
  return {f"tokenizers/{n}": d for n, d in tree_digests(directory).items()
          if ".tmp" not in n}


def check_tokenizers(workdir: str, meta: Mapping[str, Any], where: str,
                     error: type[ValueError] = CheckpointError) -> None:
  """Raises `error` naming a tokenizer file of `workdir` that `where` was not trained with."""
  for name, digest in sorted((meta.get("tokenizers") or {}).items()):
    path = os.path.join(workdir, name)
    if not files.exists(path):
      raise error(f"{path} is missing: {where} was trained with it")
    if file_digest(path) != digest:
      raise error(f"{path} is not the tokenizer {where} was trained with (its digest differs); "
                  "restore the run's own file")
