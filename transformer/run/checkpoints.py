"""Orbax checkpoints: async saves, keep latest K + best, exact resume, compatibility.

Layout: `<workdir>/checkpoints/<step>/` with the items
  state    the train-state pytree (ocp StandardSave; restores onto any mesh via abstract shardings)
  data     the Grain iterator state (grain.checkpoint.CheckpointSave), when an iterator is given:
           one process_<i>-of-<n>.json per process; a run with another process count resumes
           from all n of them (the iterator's set_state_from_hosts: elastic resume)
  meta     JSON: {"step", "config", "metrics", "tokenizers", "digest"} (the run's config, that
           step's metrics, the digests of the workdir's tokenizer files it was trained with)
  metrics  orbax's own copy of the metrics (when `checkpoint.keep_best_by` is set)
  digest.json  {"algorithm", "files": {path: hex digest}} of every file above, written once orbax
           has committed the step (its rename of the tmp dir), by process 0; inside the step
           directory, so orbax's garbage collection removes it with its step

Verification: `verify_step` rehashes a step's files against its digest.json. A flipped bit, a
truncated or missing file, or a missing digest.json of a step whose meta says it has one fails; a
step written before digests existed (no digest.json, meta without "digest") passes unverified.
Resume uses the newest step that verifies (`latest_good_step`): each failing newer step is named
in one line and moved aside to `<step>.corrupt` (kept for inspection, never listed as a step);
evaluation, restore(), fine-tuning and conversion (`read_params`) refuse a failing step in one line
that names the newest step that verifies. The digest is CRC-32 (DIGEST_ALGORITHM), files hashed
in parallel; its cost is measured by benchmarks/checkpoint_digest.py (docs/reliability.md#checksummed-checkpoints).

Retention (a trap of orbax: its max_to_keep together with best_fn keeps the K *best*
and may delete the newest checkpoint, which breaks resume). We use an explicit preservation policy:
keep a checkpoint if it is among the latest `checkpoint.keep` OR it is the single best by
`checkpoint.keep_best_by` (`best_mode` min|max). Checkpoints saved without that metric (or with
NaN) rank as the worst, so they count only toward "latest". A save that was killed leaves
`<step>.orbax-checkpoint-tmp-*`; it is never listed as a step and is removed by the next
Checkpointer on that directory (before its first save).

Usage in a training loop:
  check_compatible(workdir, config_dict)        # before anything writes into workdir
  ckpt = Checkpointer(workdir, cfg.checkpoint, config=config_dict)
  if ckpt.latest_step() is not None:
    state = ckpt.restore(None, abstract_state, data_iterator=it)
  preempt = preemption.install_preemption_handler()   # transformer/train/preemption.py
  for step ...:
    ckpt.save(step, state, it, metrics)          # saves when step % every_steps == 0
    if preempt.should_stop(step): ckpt.save(step, state, it, force=True); break
  ckpt.close()                                   # waits for the last async save

Reading a trained run back (evaluation, the notebook API, fine-tuning's transformer/train/finetune.py),
the last section: load_run_config, read_params (one checkpoint's raw or EMA parameters, or the
mean of the last N), restore_params. This module is over 400 lines on purpose: everything that
reads or writes a workdir's checkpoints sits behind this one boundary.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import threading
import zlib
from typing import Any, Mapping

from absl import logging
import jax
import ml_collections
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as cm

from transformer import config as config_lib, files, schema
from transformer.config import Config
from transformer.model import models, scoring
from transformer.train import optim


class CheckpointError(ValueError):
  """A checkpoint that cannot be used with this config (one-line message)."""


# ---------------------------------------------------------------------------------------------
# Digests: every file of a committed step, and the run files (tokenizers) a step was trained with.

DIGEST_FILE = "digest.json"
# A step's files are checked with CRC-32 (zlib: ~4x BLAKE2b's speed on one core), as object
# stores check uploads: it catches every flipped bit and burst of up to 32, and any truncation
# with probability 1 - 2**-32; it is no defence against deliberate tampering. Tokenizer files
# (small) are named by BLAKE2b-256.
DIGEST_ALGORITHM = "crc32"
ALGORITHMS = ("crc32", "blake2b-256")
CORRUPT_SUFFIX = ".corrupt"
_CHUNK = 1 << 22
_BLOCK = 1 << 26  # crc32 digests: one CRC per 64 MiB of a file, the blocks hashed in parallel


def _crc32(path: str, start: int = 0, length: int = -1) -> str:
  """The CRC-32 (8 hex digits) of `length` bytes (-1: to the end) of a file from `start`."""
  crc = 0
  with files.open_binary(path) as f:
    f.seek(start)
    while length and (chunk := f.read(_CHUNK if length < 0 else min(_CHUNK, length))):
      crc = zlib.crc32(chunk, crc)
      length -= len(chunk) if length > 0 else 0
  return f"{crc:08x}"


def file_digest(path: str, algorithm: str = "blake2b-256") -> str:
  """The hex digest of the file at `path` (ALGORITHMS; crc32: one per _BLOCK bytes, joined by
  commas)."""
  if algorithm == "crc32":
    size = files.size(path)
    return ",".join(_crc32(path, b, _BLOCK) for b in range(0, max(size, 1), _BLOCK))
  digest = hashlib.blake2b(digest_size=32)
  with files.open_binary(path) as f:
    while chunk := f.read(_CHUNK):
      digest.update(chunk)
  return digest.hexdigest()


def tree_digests(directory: str, names: list[str] | None = None,
                 algorithm: str = "blake2b-256") -> dict[str, str]:
  """{relative path: file_digest} of `names` (default: every file) under `directory`, hashed
  in parallel (zlib and hashlib release the GIL on large buffers): crc32 by blocks of _BLOCK
  bytes, so that one large file uses every core."""
  names = files.walk(directory) if names is None else names
  paths = [os.path.join(directory, n) for n in names]
  with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
    if algorithm != "crc32":
      return dict(zip(names, pool.map(lambda p: file_digest(p, algorithm), paths)))
    blocks = [(i, b) for i, p in enumerate(paths)
              for b in range(0, max(files.size(p), 1), _BLOCK)]
    crcs = list(pool.map(lambda ib: _crc32(paths[ib[0]], ib[1], _BLOCK), blocks))
  out: dict[str, list[str]] = {n: [] for n in names}
  for (i, _), crc in zip(blocks, crcs):
    out[names[i]].append(crc)
  return {n: ",".join(c) for n, c in out.items()}


def write_step_digest(step_dir: str) -> None:
  """Writes `<step_dir>/digest.json`: the digest of every file of the committed step."""
  names = [n for n in files.walk(step_dir) if not n.startswith(DIGEST_FILE)]
  record = {"algorithm": DIGEST_ALGORITHM,
            "files": tree_digests(step_dir, names, DIGEST_ALGORITHM)}
  files.write_text_atomic(os.path.join(step_dir, DIGEST_FILE),
                          json.dumps(record, indent=0, sort_keys=True))


def read_step_meta(step_dir: str) -> dict[str, Any] | None:
  """The `meta` item of a step read as plain JSON (no orbax), or None if unreadable."""
  try:
    meta = json.loads(files.read_text(os.path.join(step_dir, "meta", "metadata")))
  except (OSError, ValueError):
    return None
  return meta if isinstance(meta, dict) else None


def verify_step(step_dir: str) -> str | None:
  """None if the step's files match its digest.json (or it predates digests), else a short
  reason naming the first file that does not: changed, missing, or no digest.json."""
  path = os.path.join(step_dir, DIGEST_FILE)
  if not files.exists(path):
    meta = read_step_meta(step_dir)
    if meta is None:
      return "meta/metadata is unreadable and there is no digest.json"
    return f"no {DIGEST_FILE} (its meta says it was written with one)" if meta.get(
        "digest") else None
  try:
    record = json.loads(files.read_text(path))
    expected, algorithm = dict(record["files"]), record["algorithm"]
  except (OSError, ValueError, KeyError, TypeError):
    return f"{DIGEST_FILE} is unreadable"
  if algorithm not in ALGORITHMS:
    return f"{DIGEST_FILE} names an unknown algorithm {algorithm!r}"
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
  """Raises `error` naming the first tokenizer file of `workdir` that is not the one the step
  (`where`, its `meta`) was trained with; steps that recorded none pass."""
  recorded = meta.get("tokenizers") or {}
  for name, digest in sorted(recorded.items()):
    path = os.path.join(workdir, name)
    if not files.exists(path):
      raise error(f"{path} is missing: {where} was trained with it")
    if file_digest(path) != digest:
      raise error(f"{path} is not the tokenizer {where} was trained with (its digest differs); "
                  "restore the run's own file")


def _jsonable_metrics(metrics: Mapping[str, Any] | None) -> dict[str, float]:
  """Metric values (numpy/jax scalars) as Python floats for JSON."""
  return {str(k): float(v) for k, v in (metrics or {}).items()}


def abstract_of(tree: Any) -> Any:
  """Replaces every array of `tree` by a jax.ShapeDtypeStruct with the same sharding."""
  def leaf(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
  return jax.tree.map(leaf, tree)


class Checkpointer:
  """Asynchronous orbax checkpoints of (train state, Grain iterator, config, metrics) in a workdir."""

  def __init__(self, workdir: str, ckpt_cfg: Any, config: Any = None, read_only: bool = False):
    self.workdir = workdir
    self.directory = os.path.join(workdir, "checkpoints")
    self._digest_thread: threading.Thread | None = None
    self._tokenizers: dict[str, str] | None = None  # read at the first save
    if files.is_local(self.directory):  # a gs:// path goes to orbax as it is
      self.directory = os.path.abspath(self.directory)
    self.config = config_lib.to_dict(config)
    self._best_key = ckpt_cfg.keep_best_by
    if ckpt_cfg.keep < 1:
      raise CheckpointError(f"checkpoint.keep={ckpt_cfg.keep} must be >= 1 (the latest is needed "
                            "to resume)")
    if ckpt_cfg.best_mode not in ("min", "max"):
      raise CheckpointError(f"checkpoint.best_mode={ckpt_cfg.best_mode!r} is not min or max")
    worst = math.inf if ckpt_cfg.best_mode == "min" else -math.inf

    def metric(metrics):  # missing (no eval at that step) or NaN/inf never ranks as the best
      value = float(metrics.get(self._best_key, worst))
      return value if math.isfinite(value) else worst

    policies = [cm.LatestN(n=ckpt_cfg.keep)]
    if self._best_key:
      # BestN keeps the last n after an ascending sort; reverse=True puts the lowest last.
      policies.append(cm.BestN(get_metric_fn=metric, reverse=ckpt_cfg.best_mode == "min", n=1,
                               keep_checkpoints_without_metrics=False))
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=cm.AnySavePolicy([
            cm.FixedIntervalPolicy(max(1, ckpt_cfg.every_steps)),
            cm.PreemptionCheckpointingPolicy()]),
        preservation_policy=cm.AnyPreservationPolicy(policies),
        best_fn=metric if self._best_key else None,  # orbax records metrics only with a best_fn
        best_mode=ckpt_cfg.best_mode,
        enable_async_checkpointing=bool(ckpt_cfg.async_save),
        # A reader (evaluation, a notebook) must not delete a save that training has in flight.
        cleanup_tmp_directories=not read_only,
        create=not read_only,
        read_only=read_only)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def save(self, step: int, state: Any, data_iterator: Any = None,
           metrics: Mapping[str, Any] | None = None, force: bool = False) -> bool:
    """Starts an async save if `step` is due (every_steps, preemption) or `force`; True if saved.

    A step that is not newer than the latest saved one is skipped (returns False), so a forced save
    right after a periodic one at the same step is harmless.
    """
    latest = self.latest_step()
    if latest is not None and step <= latest:
      return False
    self._join_digest()
    if self._tokenizers is None:
      self._tokenizers = tokenizer_digests(self.workdir)
    metrics = _jsonable_metrics(metrics)
    items = dict(state=ocp.args.StandardSave(state),
                 meta=ocp.args.JsonSave({"step": int(step), "config": self.config,
                                         "metrics": metrics, "tokenizers": self._tokenizers,
                                         "digest": DIGEST_FILE}))
    if data_iterator is not None:
      import grain  # pylint: disable=g-import-not-at-top  (only with a data iterator)
      items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
    # Always hand orbax the metrics (it warns on every save without them); steps lacking the
    # best-by key rank as the worst, so they are kept only as one of the latest.
    saved = self._manager.save(step, args=ocp.args.Composite(**items),
                               metrics=metrics if self._best_key else None, force=force)
    if saved and jax.process_index() == 0:
      # Hashed once orbax has committed the step (an async save: in the background).
      self._digest_thread = threading.Thread(target=self._write_digest, args=(step,),
                                             name=f"checkpoint-digest-{step}", daemon=True)
      self._digest_thread.start()
    return saved

  def _write_digest(self, step: int) -> None:
    try:
      self._manager.wait_until_finished()
      write_step_digest(os.path.join(self.directory, str(step)))
    except Exception as e:  # pylint: disable=broad-except  (the step then fails verification)
      logging.warning("could not write %s of %s/%d: %s", DIGEST_FILE, self.directory, step,
                      (str(e).splitlines() or [type(e).__name__])[0])

  def _join_digest(self) -> None:
    if self._digest_thread is not None:
      self._digest_thread.join()
      self._digest_thread = None

  def verify(self, step: int) -> str | None:
    """None if checkpoint `step` verifies (verify_step), else the reason it does not."""
    self.wait()
    return verify_step(os.path.join(self.directory, str(step)))

  def latest_good_step(self, quarantine: bool = False) -> int | None:
    """The newest step that verifies, or None. Each newer step that does not is logged in one
    line and, with `quarantine` (a resuming writer) and a good step to resume from, moved to
    `<step>.corrupt`, so that training saves that step anew."""
    bad, good = [], None
    for step in reversed(self.all_steps()):
      reason = self.verify(step)
      if reason is None:
        good = step
        break
      logging.warning("checkpoint %s/%d fails verification: %s", self.directory, step, reason)
      bad.append(step)
    if quarantine and bad and good is not None:
      if jax.process_index() == 0:
        for step in bad:
          where = os.path.join(self.directory, str(step))
          files.rename(where, where + CORRUPT_SUFFIX)
      if jax.process_count() > 1:
        from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
        multihost_utils.sync_global_devices("checkpoints: corrupt steps moved aside")
      self._manager.reload()
    return good

  def should_save(self, step: int) -> bool:
    """True if `save(step, ...)` would save without `force`."""
    return self._manager.should_save(step)

  def latest_step(self) -> int | None:
    """The newest complete (committed) step, or None."""
    return self._manager.latest_step()

  def best_step(self) -> int | None:
    """The step with the best `keep_best_by` metric, or None if no checkpoint carries it."""
    step = self._manager.best_step() if self._best_key else None
    if step is None:
      return None
    value = (self._manager.metrics(step) or {}).get(self._best_key)
    return step if value is not None and math.isfinite(value) else None

  def all_steps(self) -> list[int]:
    """All complete steps on disk, ascending."""
    return sorted(self._manager.all_steps())

  def metadata(self, step: int | None = None) -> dict[str, Any]:
    """The `meta` item ({"step", "config", "metrics"}) of `step` (default: the latest)."""
    step = self._step_or_latest(step)
    restored = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(restored["meta"])

  def restore(self, step: int | None, abstract_state: Any, data_iterator: Any = None) -> Any:
    """Restores the train state of `step` (None = latest) onto `abstract_state`'s shardings.

    `abstract_state` leaves are jax.ShapeDtypeStruct with the target shardings (see abstract_of /
    jax.eval_shape), so a state saved on one mesh restores onto another device count. When
    `data_iterator` is given its position is restored in place.
    """
    step = self._step_or_latest(step)
    self._manager.wait_until_finished()
    items = dict(state=ocp.args.StandardRestore(abstract_state))
    host_states = None if data_iterator is None else self._other_host_count_states(step)
    if data_iterator is not None and host_states is None:
      import grain  # pylint: disable=g-import-not-at-top  (only with a data iterator)
      items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
      first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
      raise CheckpointError(
          f"cannot restore {self.directory}/{step} into this train state (did the model or "
          f"optimizer config change? see check_compatible): {first}") from e
    if host_states is not None:
      self._reshard_iterator(data_iterator, host_states, step)
    return restored["state"]

  def restore_latest_good(self, abstract_state: Any, data_iterator: Any = None
                          ) -> tuple[int, Any]:
    """(step, train state) of the newest step that verifies, for a resuming writer: the latest
    step is verified while it is restored (one read's time, not two); if it fails, the failing
    steps are named and moved aside (latest_good_step(quarantine=True)) and the newest good one
    is restored. CheckpointError if none verifies."""
    self.wait()
    latest = self.latest_step()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
      check = pool.submit(self.verify, latest)
      try:
        state, error = self.restore(latest, abstract_state, data_iterator), None
      except Exception as e:  # pylint: disable=broad-except  (a damaged step: orbax raises anything)
        state, error = None, e
      if check.result() is None:
        if error is not None:
          raise error
        return latest, state
    good = self.latest_good_step(quarantine=True)
    if good is None:
      raise CheckpointError(f"no checkpoint in {self.directory} verifies (steps "
                            f"{self.all_steps()}); move them away to train afresh")
    return good, self.restore(good, abstract_state, data_iterator)

  def _other_host_count_states(self, step: int) -> list[dict[str, Any]] | None:
    """Every host's saved iterator state of `step` if it was saved by another number of
    processes than this run's (grain names the files process_<i>-of-<n>.json), else None."""
    directory = os.path.join(self.directory, str(step), "data")
    mine = f"process_{jax.process_index()}-of-{jax.process_count()}.json"
    if not files.isdir(directory) or files.exists(os.path.join(directory, mine)):
      return None
    saved: dict[int, dict[int, str]] = {}  # process count -> {index: file name}
    for name in files.listdir(directory):
      match = re.fullmatch(r"process_(\d+)-of-(\d+)\.json", name)
      if match:
        saved.setdefault(int(match[2]), {})[int(match[1])] = name
    counts = sorted(saved)
    if len(counts) != 1 or sorted(saved[counts[0]]) != list(range(counts[0])):
      raise CheckpointError(f"{directory} does not hold the iterator states of every process of "
                            f"one run (found {', '.join(sorted(files.listdir(directory)))})")
    return [json.loads(files.read_text(os.path.join(directory, saved[counts[0]][i])))
            for i in range(counts[0])]

  def _reshard_iterator(self, data_iterator: Any, host_states: list[dict[str, Any]],
                        step: int) -> None:
    """Maps the iterator states of a run with another process count onto this process."""
    where = f"{self.directory}/{step}"
    if not hasattr(data_iterator, "set_state_from_hosts"):
      raise CheckpointError(
          f"{where} was written by {len(host_states)} processes, this run has "
          f"{jax.process_count()}, and its data iterator ({type(data_iterator).__name__}) cannot "
          "be resharded; resume with the original number of processes")
    logging.info("Resharding the data iterator of %s from %d to %d processes.", where,
                 len(host_states), jax.process_count())
    try:
      data_iterator.set_state_from_hosts(host_states)
    except (ValueError, KeyError, TypeError) as e:
      raise CheckpointError(f"cannot reshard the data iterator states of {where}: {e}") from e

  def _step_or_latest(self, step: int | None) -> int:
    if step is None:
      step = self.latest_step()
    if step is None or step not in self._manager.all_steps():
      raise CheckpointError(f"no checkpoint for step {step} in {self.directory} "
                            f"(steps: {self.all_steps()})")
    return step

  def wait(self) -> None:
    """Blocks until the pending async save is committed and its digest written."""
    self._manager.wait_until_finished()
    self._join_digest()

  def close(self) -> None:
    """Waits for pending saves (and their digests) and releases the manager."""
    self.wait()
    self._manager.close()


def _saved_config(workdir: str) -> tuple[dict[str, Any] | None, str]:
  """The config of the newest checkpoint in workdir whose meta reads (else workdir/config.json),
  and its source."""
  directory = os.path.join(workdir, "checkpoints")
  if files.isdir(directory):
    for step in sorted((int(n) for n in files.listdir(directory) if n.isdigit()), reverse=True):
      meta = read_step_meta(os.path.join(directory, str(step)))
      if meta and meta.get("config"):
        return meta["config"], f"{directory}/{step}"
  path = os.path.join(workdir, "config.json")
  if files.exists(path):
    return json.loads(files.read_text(path)), path
  return None, ""


def check_compatible(workdir: str, config: Any) -> None:
  """Raises CheckpointError naming the first key the run already in `workdir` fixed (role
  `fixed`, or `on_off`: whether it is 0) that differs in `config`; does nothing for an empty
  workdir. Derived sizes (role `derived`) written 0 on either side are not compared."""
  saved, source = _saved_config(workdir)
  if not saved:
    return
  if problem := config_lib.format_problem(saved, source):
    raise CheckpointError(problem)
  new = config_lib.to_dict(config)
  for key in schema.with_role(schema.FIXED) + schema.with_role(schema.ON_OFF):
    old, cur = schema.lookup(saved, key), schema.lookup(new, key)
    roles = schema.KEYS[key].roles
    if old is None or cur is None or (schema.DERIVED in roles and (not old or not cur)):
      continue
    if (bool(old) != bool(cur)) if schema.ON_OFF in roles else (old != cur):
      raise CheckpointError(f"workdir {workdir} holds a run with {key}={old!r}, this config has "
                            f"{cur!r} (from {source}); use another --workdir or the same config")


# ---------------------------------------------------------------------------------------------
# Reading a trained run back for inference (evaluation.py, the notebook API, the sweep report):
# `load_run_config(workdir, overrides)` gives the run's Config with the overrides evaluation may
# apply (the keys of role `eval`: none changes what was trained); `restore_params(cfg, workdir, step)` gives
# the parameters of a checkpoint, checked against the shapes that config builds. Both only read
# the workdir: checkpoints are opened read-only, so a save that training has in flight is left
# alone. Every failure (a missing, truncated or foreign checkpoint, a bad config.json) is an
# EvaluationError whose one-line message names the file, step or parameter.

STEP_NAMES = ("latest", "best")
PARAMS_CHOICES = ("auto", "ema", "raw")  # read_params: which parameters of a checkpoint

class EvaluationError(ValueError):
  """A workdir, step or split that cannot be evaluated; the message is one line naming it."""


def _first_line(error: BaseException) -> str:
  return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


def load_run_config(workdir: str, overrides: dict[str, Any] | None = None) -> Config:
  """The run's Config from `<workdir>/config.json` with `overrides` (flat dotted keys) applied."""
  path = os.path.join(workdir, "config.json")
  if not files.exists(path):
    raise EvaluationError(f"{path} not found: is {workdir!r} the --workdir of a training run?")
  try:
    saved = json.loads(files.read_text(path))
  except ValueError as e:  # JSONDecodeError, or UnicodeDecodeError for a binary file
    raise EvaluationError(f"{path}: not a JSON config ({_first_line(e)})") from None
  if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
    raise EvaluationError(f"{path}: not a run's config (no 'model' section)")
  if problem := config_lib.format_problem(saved, path):
    raise EvaluationError(problem)
  cd = ml_collections.ConfigDict(saved)
  overridable = schema.with_role(schema.EVAL)
  for key, value in (overrides or {}).items():
    if key not in overridable:
      others = sorted(k for k in overridable if not k.startswith("eval."))
      raise config_lib.ConfigError(f"--config.{key} cannot be overridden at evaluation (it would "
                                   f"not match the trained parameters); allowed: eval.*, "
                                   f"{', '.join(others)}")
    try:
      cd.update_from_flattened_dict({key: value})
    except (KeyError, AttributeError, TypeError) as e:
      raise config_lib.ConfigError(f"--config.{key}={value!r}: {_first_line(e)}") from None
  return config_lib.from_configdict(cd)


def resolve_step(checkpointer: Any, step: int | str | None) -> int:
  """None/'latest' -> the newest step, 'best' -> the best by checkpoint.keep_best_by, int -> it."""
  if isinstance(step, str) and step not in STEP_NAMES:
    try:
      step = int(step)
    except ValueError:
      raise EvaluationError(f"--step={step!r} must be an integer, 'latest' or 'best'") from None
  available = checkpointer.all_steps()
  if not available:
    raise EvaluationError(f"no checkpoints in {checkpointer.directory}")
  if step is None or step == "latest":
    return int(checkpointer.latest_step())
  if step == "best":
    best = checkpointer.best_step()
    if best is None:
      raise EvaluationError(f"no best checkpoint in {checkpointer.directory} (checkpoint."
                            f"keep_best_by is unset or never logged); use --step=latest")
    return int(best)
  if int(step) not in available:
    raise EvaluationError(f"no checkpoint for step {step} in {checkpointer.directory} "
                          f"(steps: {available})")
  return int(step)


@contextlib.contextmanager
def _quiet_orbax():
  """Mutes orbax's warnings (every item not asked for, each option a read-only manager resets)."""
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)
  try:
    yield
  finally:
    logging.set_verbosity(verbosity)


def _read_state(directory: str, step: int) -> dict[str, Any]:
  """The saved train state of `step` as nested dicts, on the first local device.

  The target structure comes from the checkpoint's own metadata, not from today's optimizer code,
  so a run restores for evaluation even if the optimizer state layout has changed since.
  """
  with _quiet_orbax():
    manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(read_only=True),
                                    item_handlers={"state": ocp.StandardCheckpointHandler()})
    try:
      tree = manager.item_metadata(step)["state"]
      tree = getattr(tree, "tree", tree)
      device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
      abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                              tree)
      return manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract)))["state"]
    finally:
      manager.close()


def _check_params(cfg: Config, model: Any, params: Any, where: str) -> None:
  """Raises EvaluationError naming the first parameter whose shape differs from the model's."""
  expected = jax.eval_shape(
      lambda r: scoring.init_params(model, r, models.example_batch(cfg.model)), jax.random.key(0))
  flat = lambda tree: {jax.tree_util.keystr(k): tuple(v.shape)  # noqa: E731
                       for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}
  want, got = flat(expected), flat(params)
  for key in sorted(set(want) | set(got)):
    if want.get(key) != got.get(key):
      raise EvaluationError(f"{where}: parameter {key} has shape {got.get(key)} but the config in "
                            f"config.json builds {want.get(key)}")


def _normalised(config: Mapping[str, Any]) -> dict[str, Any]:
  return config_lib.to_dict(config_lib.from_configdict(ml_collections.ConfigDict(dict(config))))


def run_config_difference(cfg: Config, trained: Mapping[str, Any]) -> str | None:
  """The first model.* or data.* key whose value in `cfg` differs from the `trained` config dict,
  as 'key=cfg value (trained value)'; None if none does. Keys evaluation may override (role
  `eval`) and those a fine-tuning sets itself (role `finetune`: regularisation and execution,
  never the function) are not compared, nor derived sizes written 0."""
  try:
    theirs = _normalised(trained)
  except (ValueError, TypeError, KeyError) as e:
    return f"the checkpoint's config does not read ({_first_line(e)})"
  mine = config_lib.to_dict(cfg)
  for section in ("model", "data"):
    for key in sorted(set(mine[section]) | set(theirs.get(section, {}))):
      name = f"{section}.{key}"
      roles = schema.KEYS[name].roles if name in schema.KEYS else frozenset()
      if schema.EVAL in roles or schema.FINETUNE in roles:
        continue
      if schema.DERIVED in roles and not (mine[section].get(key) and theirs[section].get(key)):
        continue
      if mine[section].get(key) != theirs.get(section, {}).get(key):
        return f"{name}={mine[section].get(key)!r} (trained with {theirs[section].get(key)!r})"
  return None


def check_step(cfg: Config, workdir: str, step: int, available: list[int]) -> None:
  """Raises EvaluationError (one line) if checkpoint `step` of the run in `workdir` does not
  verify (verify_step; the line names the newest step that does), if a tokenizer file of the
  workdir is not the one it was trained with, or if `cfg` (config.json with evaluation's
  overrides) differs from the config it was trained with (run_config_difference)."""
  directory = os.path.join(workdir, "checkpoints")
  where = f"{directory}/{step}"
  reason = verify_step(where)
  if reason is not None:
    good = next((s for s in sorted(available, reverse=True)
                 if s != step and verify_step(os.path.join(directory, str(s))) is None), None)
    offer = (f"the newest checkpoint that verifies is step {good}: use --step={good}"
             if good is not None else "no other checkpoint of the run verifies")
    raise EvaluationError(f"checkpoint {where} fails verification ({reason}); {offer}")
  meta = read_step_meta(where) or {}
  check_tokenizers(workdir, meta, f"checkpoint {where}", EvaluationError)
  if meta.get("config"):
    difference = run_config_difference(cfg, meta["config"])
    if difference is not None:
      raise EvaluationError(f"{workdir}/config.json is not the config checkpoint {where} was "
                            f"trained with: {difference}; restore the run's config.json")


@dataclasses.dataclass(frozen=True)
class RestoredParams:
  """What read_params restored: the parameters, the (newest) step, their source ('ema' or 'raw')
  and the steps whose parameters they are (several when averaged)."""
  params: Any
  step: int
  source: str
  steps: tuple[int, ...]


def _read_params(directory: str, step: int, available: list[int], which: str) -> tuple[Any, str]:
  """(the EMA or raw parameters, 'ema'|'raw') of one checkpoint; EMA cast to the params' dtypes."""
  try:
    state = _read_state(directory, step)
  except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore raise many kinds)
    others = [s for s in available if s != step]
    hint = f"; other steps: {others} (--step=N)" if others else ""
    raise EvaluationError(f"cannot read the checkpoint {directory}/{step} (truncated or not a "
                          f"train state?): {type(e).__name__}: {_first_line(e)}{hint}") from None
  ema = state.get("ema_params")
  if which == "raw" or (which == "auto" and ema is None):
    return state["params"], "raw"
  if ema is None:
    raise EvaluationError(f"--params=ema: {directory}/{step} holds no EMA of the parameters (its "
                          "run had train.ema_decay=0); use --params=raw")
  return jax.tree.map(lambda e, p: e.astype(p.dtype), ema, state["params"]), "ema"


def read_params(cfg: Config, workdir: str, step: int | str | None = None, params: str = "auto",
                average_last: int = 0) -> RestoredParams:
  """The parameters of the run in `workdir` to evaluate, restored read-only onto the first local
  device.

  params: 'auto' (the EMA when the run kept one, i.e. train.ema_decay > 0, else the raw ones),
  'ema' or 'raw'. average_last=N > 0: the elementwise float32 mean (optim.average_trees) of those
  parameters over the run's N newest checkpoints instead of one checkpoint's (step must then be
  None or 'latest'); fewer than N of them kept is an EvaluationError naming checkpoint.keep and
  the steps found (retention keeps the latest checkpoint.keep and one best).
  """
  if params not in PARAMS_CHOICES:
    raise EvaluationError(f"--params={params!r} is not one of {'|'.join(PARAMS_CHOICES)}")
  if isinstance(average_last, bool) or not isinstance(average_last, int) or average_last < 0:
    raise EvaluationError(f"--average_last={average_last!r} must be an integer >= 0 (0 = off)")
  if average_last and step not in (None, "latest"):
    raise EvaluationError(f"--average_last={average_last} averages the newest checkpoints; it "
                          f"cannot be combined with --step={step}")
  if not files.isdir(os.path.join(workdir, "checkpoints")):
    raise EvaluationError(f"no checkpoints in {workdir}: has the run saved one yet?")
  with _quiet_orbax():
    ckpt = Checkpointer(workdir, cfg.checkpoint, read_only=True)
  try:
    chosen = [resolve_step(ckpt, step)]
    directory, available = ckpt.directory, ckpt.all_steps()
  finally:
    ckpt.close()
  if average_last:
    if average_last > min(len(available), cfg.checkpoint.keep):
      raise EvaluationError(
          f"--average_last={average_last} needs the run's {average_last} newest checkpoints; it "
          f"keeps the last checkpoint.keep={cfg.checkpoint.keep} (steps found in {directory}: "
          f"{available}); average fewer, or train with --config.checkpoint.keep={average_last} "
          "or more")
    chosen = available[-average_last:]
  model, trees, source = models.build_model(cfg.model), [], ""
  with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
    for s in chosen:  # each step verified (check_step) while it is read; its error comes first
      check = pool.submit(check_step, cfg, workdir, s, available)
      try:
        (tree, source), error = _read_params(directory, s, available, params), None
      except EvaluationError as e:
        error = e
      check.result()
      if error is not None:
        raise error
      _check_params(cfg, model, tree, f"{directory}/{s}")
      trees.append(tree)
  return RestoredParams(trees[0] if len(trees) == 1 else optim.average_trees(trees), chosen[-1],
                        source, tuple(chosen))


def restore_params(cfg: Config, workdir: str, step: int | str | None = None,
                   params: str = "auto") -> tuple[Any, int]:
  """(params, step) of one checkpoint in `workdir` (read_params: the EMA by default for a run
  that kept one), restored read-only onto the first local device."""
  restored = read_params(cfg, workdir, step, params)
  return restored.params, restored.step

