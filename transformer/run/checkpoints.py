"""Orbax checkpoints of a training run: async saves, retention, verified resume, compatibility.

`<workdir>/checkpoints/<step>/` holds `state` (the train state; restores onto any mesh), `data`
(one Grain iterator state per process, process_<i>-of-<n>.json), `meta` (JSON {"step", "config",
"metrics", "tokenizers", "digest"}), orbax's `metrics` and digest.json (digests.py). The latest
`checkpoint.keep` and the best by `keep_best_by` are kept (orbax's max_to_keep would keep the K
best, perhaps not the newest that resume needs).
"""

import concurrent.futures
import json
import math
import os
import re
import threading
from typing import Any, Mapping

from absl import logging
import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as cm

from transformer import config as config_lib, files, keyspec, schema
from transformer.run import digests, orbax_teardown
from transformer.run.digests import CheckpointError


def abstract_of(tree: Any) -> Any:
  """Replaces every array of `tree` by a jax.ShapeDtypeStruct with the same sharding."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)


class _KeepLinked:
  """A preservation policy: keeps every step whose directory is a symbolic link (retention would
  have to delete where it points; orbax's rmtree refuses a link and fails the save)."""

  def __init__(self, directory: str):
    self.directory = directory

  def should_preserve(self, checkpoints: Any, *, context: Any) -> list[bool]:
    del context
    return [os.path.islink(os.path.join(self.directory, str(c.step))) for c in checkpoints]


class Checkpointer:
  """Async orbax checkpoints of (train state, Grain iterator, config, metrics) in a workdir."""

  def __init__(self, workdir: str, ckpt_cfg: Any, config: Any = None, read_only: bool = False):
    orbax_teardown.finish_writes_first()  # readers too: a failed restore's reads end so
    self.workdir = workdir
    self.directory = os.path.join(workdir, "checkpoints")
    self._digest_thread: threading.Thread | None = None
    self._tokenizers: dict[str, str] | None = None  # read at the first save
    self._failure: tuple[int, BaseException] | None = None  # a failed async save: (step, error)
    self._reported = False  # check_saves raised it
    self._saving = -1  # the step of the newest save started
    if files.is_local(self.directory):  # a gs:// path goes to orbax as it is
      self.directory = os.path.abspath(self.directory)
      self._check_links(read_only)
    self._check_metadata(read_only)  # before orbax lists the steps and reads their metadata
    self.config = config_lib.to_dict(config)
    self._best_key = ckpt_cfg.keep_best_by
    worst = math.inf if ckpt_cfg.best_mode == "min" else -math.inf

    def metric(metrics):  # missing (no eval at that step) or NaN/inf never ranks as the best
      value = float(metrics.get(self._best_key, worst))
      return value if math.isfinite(value) else worst

    policies = [cm.LatestN(n=ckpt_cfg.keep), _KeepLinked(self.directory)]
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
        # Directories made in save(): one that cannot be made (a read-only or full disk) raises
        # there, not in a background thread that the save's other writes wait minutes for.
        async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
        # A reader (evaluation, a notebook) must not delete a save that training has in flight.
        cleanup_tmp_directories=not read_only, create=not read_only, read_only=read_only)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def _step_dirs(self) -> list[int]:
    """The steps of the directory's `<step>` entries, newest first (read before orbax does)."""
    if not files.isdir(self.directory):
      return []
    return sorted((int(n) for n in files.listdir(self.directory) if n.isdigit()), reverse=True)

  def _check_links(self, read_only: bool) -> None:
    """Names each step that is a symbolic link in one line: read where it points, never deleted."""
    for step in [] if read_only else self._step_dirs():
      where = os.path.join(self.directory, str(step))
      if os.path.islink(where):
        logging.warning("checkpoint %s is a symbolic link (to %s): it is read, and never deleted "
                        "by checkpoint.keep", where, os.path.realpath(where))

  def _check_metadata(self, read_only: bool) -> None:
    """Verifies the files orbax reads to list and open each step: a writer moves a failing step
    aside (when another step verifies), a reader refuses in one line naming the file and step."""
    steps = self._step_dirs()
    bad = {s: r for s in steps if (r := digests.verify_step(
        os.path.join(self.directory, str(s)), metadata_only=True)) is not None}
    if not bad:
      return
    for step, reason in bad.items():
      logging.warning("checkpoint %s/%d fails verification: %s", self.directory, step, reason)
    good = next((s for s in steps if s not in bad), None)
    step = max(bad)
    where = f"{self.directory}/{step}"
    if read_only:
      offer = (f"the newest checkpoint that verifies is step {good}: move {where} aside (to "
               f"{where}{digests.CORRUPT_SUFFIX}) to read the others, or resume training, which "
               "does" if good is not None else "no other checkpoint of the run verifies")
      raise CheckpointError(f"checkpoint {where} fails verification ({bad[step]}); {offer}")
    if good is None:
      raise CheckpointError(f"no checkpoint in {self.directory} verifies ({where}: {bad[step]}); "
                            "move them away to train afresh")
    self._move_aside(sorted(bad))

  def _move_aside(self, steps: list[int]) -> None:
    """Renames each of `steps` to `<step>.corrupt` (nothing is deleted), once for all hosts."""
    if jax.process_index() == 0:
      for step in steps:
        where = os.path.join(self.directory, str(step))
        files.rename(where, where + digests.CORRUPT_SUFFIX)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices("checkpoints: corrupt steps moved aside")

  def save(self, step: int, state: Any, data_iterator: Any = None,
           metrics: Mapping[str, Any] | None = None, force: bool = False) -> bool:
    """Starts an async save if `step` is due (or `force`) and newer than the latest; True if so."""
    latest = self.latest_step()
    if latest is not None and step <= latest:
      return False
    self._join_digest()
    self.check_saves()
    if self._tokenizers is None:
      self._tokenizers = digests.tokenizer_digests(self.workdir)
    metrics = {str(k): float(v) for k, v in (metrics or {}).items()}
    items = dict(state=ocp.args.StandardSave(state),
                 meta=ocp.args.JsonSave({"step": int(step), "config": self.config,
                                         "metrics": metrics, "tokenizers": self._tokenizers,
                                         "digest": digests.DIGEST_FILE}))
    if data_iterator is not None:
      import grain  # pylint: disable=g-import-not-at-top  (only with a data iterator)
      items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
    # orbax warns on every save without metrics when it has a best_fn.
    saved = self._manager.save(step, args=ocp.args.Composite(**items),
                               metrics=metrics if self._best_key else None, force=force)
    self._saving = step if saved else self._saving
    if saved and jax.process_index() == 0:  # hashed once orbax has committed the step
      self._digest_thread = threading.Thread(target=self._write_digest, args=(step,),
                                             name=f"checkpoint-digest-{step}", daemon=True)
      self._digest_thread.start()
    return saved

  def _write_digest(self, step: int) -> None:
    step_dir = os.path.join(self.directory, str(step))
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except  (check_saves raises it)
      self._failure = self._failure or (step, e)
      if not files.exists(os.path.join(step_dir, "commit_success.txt")):
        return  # not committed; a step that was (retention failed after it) gets its digest
    try:
      digests.write_step_digest(step_dir)
    except Exception as e:  # pylint: disable=broad-except  (the step then fails verification)
      logging.warning("could not write %s of %s/%d: %s", digests.DIGEST_FILE, self.directory, step,
                      (str(e).splitlines() or [type(e).__name__])[0])

  def _join_digest(self) -> None:
    if self._digest_thread is not None:
      self._digest_thread.join()
      self._digest_thread = None

  def verify(self, step: int) -> str | None:
    """None if checkpoint `step` verifies (verify_step), else the reason it does not."""
    self.wait()
    return digests.verify_step(os.path.join(self.directory, str(step)))

  def latest_good_step(self, quarantine: bool = False) -> int | None:
    """The newest step that verifies, or None. Each newer step that does not is logged and, with
    `quarantine` and a good step to resume from, moved to `<step>.corrupt`."""
    bad, good = [], None
    for step in reversed(self.all_steps()):
      reason = self.verify(step)
      if reason is None:
        good = step
        break
      logging.warning("checkpoint %s/%d fails verification: %s", self.directory, step, reason)
      bad.append(step)
    if quarantine and bad and good is not None:
      self._move_aside(bad)
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
    """The `meta` item of `step` (default: the latest)."""
    meta = ocp.args.Composite(meta=ocp.args.JsonRestore())
    return dict(self._manager.restore(self._step_or_latest(step), args=meta)["meta"])

  def restore(self, step: int | None, abstract_state: Any, data_iterator: Any = None) -> Any:
    """The state of `step` (None: latest) on `abstract_state`'s shardings, and `data_iterator`'s."""
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
    """(step, state) of the newest step that verifies, failing ones moved aside; CheckpointError."""
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
    """Every host's saved iterator state of `step` if another process count saved it, else None."""
    directory = os.path.join(self.directory, str(step), "data")
    mine = f"process_{jax.process_index()}-of-{jax.process_count()}.json"
    if not files.isdir(directory) or files.exists(os.path.join(directory, mine)):
      return None
    names = sorted(files.listdir(directory))
    found = sorted((int(m[2]), int(m[1]), m[0]) for m in  # (process count, index, file name)
                   (re.fullmatch(r"process_(\d+)-of-(\d+)\.json", n) for n in names) if m)
    count = found[0][0] if found else 0
    if not found or [(c, i) for c, i, _ in found] != [(count, i) for i in range(count)]:
      raise CheckpointError(f"{directory} does not hold the iterator states of every process of "
                            f"one run (found {', '.join(names)})")
    return [json.loads(files.read_text(os.path.join(directory, name))) for _, _, name in found]

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
    step = self.latest_step() if step is None else step
    if step is None or step not in self._manager.all_steps():
      raise CheckpointError(f"no checkpoint for step {step} in {self.directory} "
                            f"(steps: {self.all_steps()})")
    return step

  def check_saves(self) -> None:
    """Raises CheckpointError (once) if an asynchronous save has failed; reads one attribute, so
    the loop asks at every step."""
    if self._failure is None or self._reported:
      return
    self._reported = True
    step, error = self._failure
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    cause = error
    if isinstance(error, OSError) and error.errno and not error.filename:  # name the step
      cause = OSError(error.errno, error.strerror or os.strerror(error.errno),
                      f"{self.directory}/{step}")
      cause.__cause__ = error
    raise CheckpointError(
        f"checkpoint {self.directory}/{step} could not be saved: {type(error).__name__}: {first}; "
        f"the committed checkpoints are kept (steps {self.all_steps()})") from cause

  def wait(self) -> None:
    """Blocks until the pending async save is committed and its digest written; CheckpointError
    (once) if a save failed."""
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except  (check_saves raises it)
      self._failure = self._failure or (self._saving, e)
    self._join_digest()
    self.check_saves()

  def close(self) -> None:
    """Waits for pending saves (and their digests) and releases the manager."""
    self.wait()
    if self._failure is None:  # after a failed save orbax's close raises that save's error again
      self._manager.close()


def _saved_config(workdir: str) -> tuple[dict[str, Any] | None, str]:
  """(config, source): of the newest checkpoint whose meta reads, else of config.json."""
  directory = os.path.join(workdir, "checkpoints")
  if files.isdir(directory):
    for step in sorted((int(n) for n in files.listdir(directory) if n.isdigit()), reverse=True):
      meta = digests.read_step_meta(os.path.join(directory, str(step)))
      if meta and meta.get("config"):
        return meta["config"], f"{directory}/{step}"
  path = os.path.join(workdir, "config.json")
  if files.exists(path):
    return json.loads(files.read_text(path)), path
  return None, ""


def check_compatible(workdir: str, config: Any) -> None:
  """Raises CheckpointError naming the first key of schema.kept_on_resume() (of role `on_off`:
  whether it is 0) that `config` changes from the run in `workdir`; derived sizes written 0 are
  not compared."""
  saved, source = _saved_config(workdir)
  if not saved:
    return
  if problem := config_lib.format_problem(saved, source):
    raise CheckpointError(problem)
  new = config_lib.to_dict(config)
  for key in schema.kept_on_resume():
    old, cur = keyspec.lookup(saved, key), keyspec.lookup(new, key)
    roles = schema.KEYS[key].roles
    if old is None or cur is None or (keyspec.DERIVED in roles and (not old or not cur)):
      continue
    if (bool(old) != bool(cur)) if keyspec.ON_OFF in roles else (old != cur):
      raise CheckpointError(f"workdir {workdir} holds a run with {key}={old!r}, this config has "
                            f"{cur!r} (from {source}); use another --workdir or the same config")
