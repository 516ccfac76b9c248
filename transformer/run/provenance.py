"""provenance.json: where and with what a run was made, and a fingerprint of the prepared data it
read, against which `check_split_data` checks the split an evaluation reads.

The fingerprint holds every split's records digest and the sha256 of the records cache of each
split the run read: training reads (and so records) data.train_split and data.eval_split; a split
first evaluated later is recorded by that evaluation when its records are the run's (trust on
first use). A cache whose records are the run's but whose bytes are not the recorded ones (edited
together with its digest file) stops the evaluation; other data differences are one warning.
"""

import datetime
import hashlib
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
from typing import Any, Mapping, Sequence

from absl import logging
from etils import epath
import jax

from transformer import files
from transformer.data import prepared

# A converted run's Hugging Face source ({"from_hf": its directory, "config": its config.json}).
CONVERTED_FROM = "converted_from.json"
# Larger splits are fingerprinted by their file sizes only: hashing them would cost too much.
DATA_HASH_LIMIT = 1 << 30
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "tensorflow-datasets",
            "numpy")


def carry_converted_from(init_from: str, workdir: str) -> None:
  """Copies the converted_from.json of the run `init_from` into `workdir` (fine-tuning from it),
  unless `workdir` has one: the fine-tuned model descends from the same Hugging Face checkpoint,
  whose config.json its export keeps (BOS id, names). A resumed run keeps its own."""
  source, target = (os.path.join(d, CONVERTED_FROM) for d in (init_from, workdir))
  if files.exists(source) and not files.exists(target):
    files.write_text_atomic(target, files.read_text(source))


def _git(args: list[str], cwd: str) -> str | None:
  try:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip() if out.returncode == 0 else None


class DataMismatchError(ValueError):
  """A split's records cache is not the one the run recorded (one-line message)."""


def _read_records(task: Any, splits: Sequence[str]) -> None:
  """Reads `splits` through the task (a Task's `records`), so that their records caches exist."""
  if hasattr(task, "records"):
    for split in splits:
      task.records(split)


def data_fingerprint(task: Any, splits: Sequence[str] | None = None) -> dict[str, Any] | None:
  """The prepared data a task reads: dataset, version, directory and per split (default all) its
  files' count and bytes, `records` + `records_sha256` (array_record shards: the same whoever
  prepared them) or `sha256`, and `cache_sha256` of its records cache; None without a directory.
  By default the splits training reads (data.train_split, data.eval_split) are read first, so
  that their caches are fingerprinted."""
  ds = getattr(task, "dataset", None)
  if ds is None or not files.isdir(ds.root):
    return None
  d = getattr(task, "data_config", None)
  if splits is None and d is not None:
    _read_records(task, [s for s in dict.fromkeys((d.train_split, d.eval_split))
                         if s in ds.splits])
  names = sorted(files.listdir(ds.root))
  prefix = ds.name.split("/")[0]
  out = {}
  for split in ds.splits if splits is None else splits:
    shards = [epath.Path(ds.root) / n for n in names if n.startswith(f"{prefix}-{split}.")]
    size = sum(p.stat().length for p in shards)
    out[split] = {"files": len(shards), "bytes": size}
    if size > DATA_HASH_LIMIT:
      out[split]["sha256"] = None
    elif shards and all(".array_record-" in p.name for p in shards):
      records, sha = prepared.prepared_records_sha256([str(p) for p in shards])
      out[split].update(records=records, records_sha256=sha)
    else:
      digest = hashlib.sha256()
      for path in shards:
        with path.open("rb") as f:
          while chunk := f.read(1 << 22):
            digest.update(chunk)
      out[split]["sha256"] = digest.hexdigest()
    cache_dir = epath.Path(ds.root) / "cache"  # what the pipeline reads instead of the shards
    caches = sorted(p for p in cache_dir.iterdir() if p.name.startswith(f"{split}-")
                    and p.name.endswith(".json")) if cache_dir.is_dir() else []
    if caches and sum(p.stat().length for p in caches) <= DATA_HASH_LIMIT:
      out[split]["cache_sha256"] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                                    for p in caches}
  # TFDS lays prepared data out as <data_dir>/<name>/<config>/<version>.
  return {"dataset": ds.name, "version": os.path.basename(os.path.normpath(ds.root)),
          "dir": ds.root, "splits": out}


# What two fingerprints of a split compare: the records when both hashed them (the same records
# may be other bytes), else the file fields both have.
_CONTENT = ("records", "records_sha256")
_FILES = ("files", "bytes", "sha256")


def _same_records(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
  """Whether two fingerprints of a split hold the same records (content only: data may move)."""
  keys = _CONTENT if all(k in a and k in b for k in _CONTENT) else [
      k for k in _FILES if k in a and k in b]
  return all(a[k] == b[k] for k in keys)


def data_difference(run: Mapping[str, Any] | None, now: Mapping[str, Any] | None,
                    split: str) -> str | None:
  """How split `split` of fingerprint `now` differs from the run's, in words, or None."""
  if not run or not now or split not in run["splits"] or split not in now["splits"]:
    return None
  a, b = run["splits"][split], now["splits"][split]
  if not _same_records(a, b):  # content only: the same data may move
    return f"{_describe(now, split)} in {now['dir']}, not {_describe(run, split)}"
  caches = a.get("cache_sha256") or {}, b.get("cache_sha256") or {}
  cache = next((n for n in sorted(set(caches[0]) & set(caches[1]))
                if caches[0][n] != caches[1][n]), None)
  if cache is not None:
    return (f"its records cache {now['dir']}/cache/{cache} is not the one the run read "
            f"(sha256 {caches[1][cache][:12]}, not {caches[0][cache][:12]})")
  return None


def _held(f: Mapping[str, Any]) -> str:
  """What one split's fingerprint `f` holds, in words."""
  return (f"{f['records']} records, records sha256 {f['records_sha256'][:12]}"
          if "records_sha256" in f else f"sha256 {(f.get('sha256') or 'not hashed')[:12]}")


def _describe(fingerprint: Mapping[str, Any], split: str) -> str:
  """One split of a data fingerprint in words."""
  f = fingerprint["splits"][split]
  held = _held(f)
  return (f"{fingerprint['dataset']} {fingerprint['version']} {split} ({f['files']} files, "
          f"{f['bytes']} bytes, {held})")


def _record_split(path: str, record: dict[str, Any], now: Mapping[str, Any], split: str) -> None:
  """Adds split `split`'s cache digests of fingerprint `now` that `record` (provenance.json's
  contents) lacks, and writes it back; a workdir that cannot be written keeps its file."""
  splits, fresh = record["data"]["splits"], now["splits"][split]
  if split in splits:
    caches = splits[split].get("cache_sha256") or {}
    new = {n: d for n, d in (fresh.get("cache_sha256") or {}).items() if n not in caches}
    if not new:
      return
    splits[split]["cache_sha256"] = caches | new
  else:
    splits[split] = dict(fresh)
  if jax.process_index() != 0:
    return
  try:
    files.write_text_atomic(path, json.dumps(record, indent=2, sort_keys=True, default=str))
  except OSError as e:
    logging.warning("could not record split %r's data digests in %s: %s", split, path, e)


def _check_caches(split: str, old: Mapping[str, Any], new: Mapping[str, Any], directory: str,
                  path: str) -> None:
  """Raises DataMismatchError when a records cache both fingerprints of `split` digest differs."""
  recorded, found = old.get("cache_sha256") or {}, new.get("cache_sha256") or {}
  for cache in sorted(set(recorded) & set(found)):
    if recorded[cache] != found[cache]:
      raise DataMismatchError(
          f"split {split!r}: its records cache {directory}/cache/{cache} has sha256 "
          f"{found[cache]}, not the {recorded[cache]} recorded in {path} (edited since the run "
          f"read it); delete it and its digest file .{cache}.sha256 to read the prepared "
          "records again")


def carried_over(path: str, data: Mapping[str, Any] | None,
                 trained: Mapping[str, str] | None = None) -> Mapping[str, Any] | None:
  """`data` (a resumed run's new fingerprint) with the cache digests that the earlier
  provenance.json at `path` recorded for splits whose records are the same (a split recorded by
  an evaluation stays recorded); raises DataMismatchError when such a cache's bytes changed, or
  when the records of a split of `trained` (those a resumed run trained and evaluated on, each
  -> the config's data file it is read from) are not the recorded ones (a file edited since)."""
  if not data or not files.exists(path):
    return data
  try:
    run = json.loads(files.read_text(path)).get("data") or {}
  except (OSError, ValueError):  # an unreadable record is replaced, as before
    return data
  for name, source in (trained or {}).items():
    old, new = (run.get("splits") or {}).get(name), data["splits"].get(name)
    if old is not None and new is not None and not _same_records(old, new):
      raise DataMismatchError(
          f"{source} changed since the run in {os.path.dirname(path)} read it: "
          f"its {name!r} split now holds {_held(new)}, the run's {_held(old)} ({path}); use "
          "another --workdir, or restore the data the run read")
  splits = {name: dict(split) for name, split in data["splits"].items()}
  for name, old in (run.get("splits") or {}).items():
    new = splits.get(name)
    if new is None or not _same_records(old, new):
      continue
    _check_caches(name, old, new, data["dir"], path)
    if old.get("cache_sha256"):
      new["cache_sha256"] = old["cache_sha256"] | (new.get("cache_sha256") or {})
  return {**data, "splits": splits}


def check_split_data(workdir: str, task: Any, split: str) -> str | None:
  """Checks split `split` of the data `task` reads (read here, so that its records cache exists)
  against `<workdir>/provenance.json` (the module doc): raises DataMismatchError naming the split,
  the cache file and both digests; returns warn_if_data_differs' warning or None."""
  path = os.path.join(workdir, "provenance.json")
  if not files.exists(path):
    return None
  record = json.loads(files.read_text(path))
  run = record.get("data")
  if not run or not getattr(task, "dataset", None):
    return None
  _read_records(task, [split])
  now = data_fingerprint(task, [split])
  if now is None or split not in now["splits"]:
    return None
  a, b = run["splits"].get(split), now["splits"][split]
  if a is not None and _same_records(a, b):
    _check_caches(split, a, b, now["dir"], path)
  if a is None or _same_records(a, b):
    _record_split(path, record, now, split)
    return None
  return warn_if_data_differs(workdir, task, split, now)


def warn_if_data_differs(workdir: str, task: Any, split: str,
                         now: Mapping[str, Any] | None = None) -> str | None:
  """Logs and returns a warning if `split`'s data (`now`: its fingerprint, if taken already) is
  not what `<workdir>/provenance.json` holds."""
  path = os.path.join(workdir, "provenance.json")
  if not files.exists(path):
    return None
  run = json.loads(files.read_text(path)).get("data")
  now = data_fingerprint(task, [split]) if now is None else now
  difference = data_difference(run, now, split)
  if difference is None:
    return None
  message = (f"the data read is not the run's ({path}): {difference}; metrics may not be "
             f"comparable with training's")
  logging.warning(message)
  return message


def provenance(mesh_shape: Mapping[str, int] | None = None,
               data: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """Where and with what a run was made: git state, packages, devices, command, `data`."""
  code_dir = os.path.dirname(os.path.abspath(__file__))
  sha = _git(["rev-parse", "HEAD"], code_dir)
  status = _git(["status", "--porcelain", "--untracked-files=no"], code_dir)
  versions = {}
  for name in PACKAGES:
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      versions[name] = None
  devices = jax.devices()
  return {
      "git_sha": sha, "git_dirty": None if status is None else bool(status), "code_dir": code_dir,
      "packages": versions, "python": sys.version.split()[0],
      "platform": devices[0].platform, "device_kind": devices[0].device_kind,
      "num_devices": len(devices), "num_local_devices": jax.local_device_count(),
      "process_count": jax.process_count(), "mesh_shape": dict(mesh_shape) if mesh_shape else None,
      "hostname": socket.gethostname(), "command": sys.argv, "data": dict(data) if data else None,
      "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
