"""Training: the loop behind `train.py`, data -> steps -> eval -> checkpoints -> reporting (the
set-up and the state to start from are start.py's, the steps steps.py's; the runs, a plain run or
train.members' members, runs.py's RunGroup). Read top to bottom: the helpers the entry points
share, `train_and_evaluate`, then `_train`, the loop in named phases, and each phase in the order
`_train` calls it (a run trained before, compiled steps and reporters, the loop's steps, the
end)."""

import contextlib
import dataclasses
import itertools
import json
import math
import os
import time
from typing import Any

from absl import logging
import jax
import numpy as np

from transformer import files
from transformer.config import Config, ConfigError, from_configdict
from transformer.infer import evaluation
from transformer.model import scoring
from transformer.model.models import build_model
from transformer.run import guard, lock, provenance, reporting
from transformer.train import finetune, members, optim, parallel, preemption, prefetch, start
from transformer.train import steps
from transformer.train.runs import EarlyStopping, Run, RunGroup

DONE_FILE = "train_done.json"  # in the workdir once a run has ended normally; see write_done_marker
FINISHED_BEFORE = "finished_before"  # a metric: the workdir held a finished run, nothing trained


class TrainingDiverged(RuntimeError):
  """The loss or gradient norm became NaN/Inf; the message is one line naming the step."""


def dispatch_size(cfg: Config, step: int) -> int:
  """train.steps_per_dispatch, cut short at the next step that logs, evaluates, saves or ends."""
  tc = cfg.train
  if tc.steps_per_dispatch == 1:
    return 1
  every = (tc.log_every_steps, cfg.eval.every_steps, cfg.checkpoint.every_steps)
  return min([tc.steps_per_dispatch, tc.num_steps - step] + [e - step % e for e in every])


def eval_sums(cfg: Config, run_eval: Any, state: Any, task: Any) -> dict[str, Any]:
  """The eval-step sums (of steps.eval_params) over `eval.num_batches` eval batches; {} for none."""
  totals: dict[str, Any] = {}
  batches = task.eval_batches(cfg.data.eval_split, batch_size=cfg.eval.batch_size or None)
  for batch in itertools.islice(batches, cfg.eval.num_batches or None):
    sums = jax.device_get(run_eval.step(state, run_eval.prepare_batch(batch)))
    for k, v in sums.items():  # per-class counts are arrays
      totals[k] = totals.get(k, 0.0) + np.asarray(v, np.float64)
  return totals


def write_done_marker(workdir: str, step: int, reason: str, metrics: dict[str, float],
                      wall_seconds: float) -> None:
  """Writes DONE_FILE atomically: step, reason (num_steps|early_stop), metrics, wall_seconds."""
  record = {"step": int(step), "reason": reason, "wall_seconds": round(wall_seconds, 3),
            "metrics": {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                        for k, v in metrics.items()}}
  files.write_text_atomic(os.path.join(workdir, DONE_FILE),
                          json.dumps(record, indent=1, sort_keys=True, default=float))


def train_and_evaluate(config: Any, workdir: str, task: Any = None,
                       init_from: str = "") -> dict[str, float]:
  """Trains `config` (a ConfigDict or Config) in `workdir`, resuming from the newest checkpoint
  that verifies; returns the final metrics (members': '<name>/<key>'). `init_from`: a run to
  fine-tune (finetune.py); `task` overrides `transformer.data.load_task`. Errors are one-line
  ConfigError, CheckpointError or TrainingDiverged. A finished workdir returns its saved metrics
  with FINISHED_BEFORE = 1.0; SIGTERM or a first SIGINT saves and returns with `preempted` or
  `interrupted` = 1.0."""
  started = time.time()
  cfg = config if isinstance(config, Config) else from_configdict(config)
  if init_from:
    cfg = finetune.init_from_config(cfg, init_from)
  start.check_loop_config(cfg)
  try:  # a run's workdir is trained only as itself: never inside another run's
    guard.check(workdir, "--workdir", own=workdir)
  except guard.WriteRefused as e:
    raise lock.WorkdirError(str(e)) from None
  for directory in (workdir, os.path.join(workdir, "checkpoints")):  # not minutes into a save
    files.check_writable(directory)
  names = [m.name for m in members.members_of(cfg)]  # checks train.members before any data loads
  if names and init_from:
    raise ConfigError("train.members: fine-tuning (--init_from) trains one run; drop one of them")
  parallel.initialize_distributed(cfg.parallel)
  main = parallel.is_main_process()
  if main:
    lock.check_trainable(workdir, members=names)
    for name in names:
      lock.check_trainable(os.path.join(workdir, name))
  # One writer per workdir (transformer/run/lock.py): held until this call returns or raises.
  with lock.writer_lock(workdir) if main else contextlib.nullcontext():
    return _train(cfg, workdir, task, init_from, started, main)


def _train(cfg: Config, workdir: str, task: Any, init_from: str, started: float, main: bool
           ) -> dict[str, float]:
  """The loop in named phases: set-up, the state to start from, compile, then dispatches of
  steps, each followed by the points that log, evaluate, save or stop; the cleanup; the finish."""
  if task is None:
    task = start.load_task(cfg, workdir, init_from)
  cfg = start.sized_config(cfg, task, init_from)
  s = start.setup(cfg, workdir, task, main, started)
  state = start.initial_state(s, init_from)
  first_step = int(np.ravel(jax.device_get(state.step))[0])
  tc = cfg.train
  if first_step >= tc.num_steps or s.group.first.saved.get("train/stopped_early"):
    return _finished_before(s, first_step)
  _log_start(s, first_step)
  compiled = _compile(s)
  state = compiled.train.prepare_state(state)
  _reporters(s, first_step)  # may refuse the resume (data changed since): the run is still finished
  _clear_done_markers(s)
  preempt = preemption.install_preemption_handler()

  # ---- the loop: dispatch steps (one, or train.steps_per_dispatch in one scan), then check the
  # dispatch before it (a one-dispatch lag keeps the device busy)
  step, stop_reason, window, pending = first_step, "", [], _Pending(s.group)
  try:
    while step < tc.num_steps:
      n = dispatch_size(cfg, step)
      state, metrics = _dispatch(s, compiled, state, step, n)
      step += n
      pending.check()  # the dispatch before, while the device runs this one
      pending.hold(step, metrics)
      window.append(metrics)
      first = step - n == first_step  # the bar shows the loss from this process's first dispatch
      s.group.first.reporter.progress(step, s.group.first_loss(metrics) if first else None)
      if step % tc.log_every_steps == 0 or step == tc.num_steps:
        pending.check()
        _log(s, step, window)
        window = []
      evaluated = step % cfg.eval.every_steps == 0 or step == tc.num_steps
      if evaluated:
        pending.check()
        if _evaluate(s, compiled, state, step):
          stop_reason = "early_stop"
      # Asked for every step (multi-host: all hosts agree on the step); at num_steps it is no stop.
      asked = [preempt.should_stop(i) for i in range(step - n + 1, step + 1)]
      if any(asked) and not stop_reason and step < tc.num_steps:
        stop_reason = preempt.reason  # 'interrupted' (SIGINT) or 'preempted' (SIGTERM)
      if stop_reason or step == tc.num_steps or s.group.first.ckpt.should_save(step):
        pending.check()
        _save(s, compiled, state, step, stop_reason, evaluated)
      if stop_reason:
        break
  finally:
    _close(s, preempt)
  return _finish(s, step, stop_reason)


# ---- the end of a run trained before


def _finished_before(s: start.Setup, first_step: int) -> dict[str, float]:
  """A workdir whose run had ended: its saved metrics, its done markers written if missing."""
  stopped_early = s.group.first.saved.get("train/stopped_early")
  for r in s.group.runs:
    r.ckpt.close()
    r.final = ({k: v for k, v in r.saved.items() if not k.startswith("early_stop/")}
               | {"step": first_step})
    if s.main and not files.exists(os.path.join(r.workdir, DONE_FILE)):  # finished before markers
      write_done_marker(r.workdir, first_step, "early_stop" if stopped_early else "num_steps",
                        r.final, time.time() - s.started)
  return s.group.result(first_step) | {FINISHED_BEFORE: 1.0}


def _clear_done_markers(s: start.Setup) -> None:
  """A run trained further is not finished: its DONE_FILE goes."""
  for r in s.group.runs:
    if s.main and files.exists(os.path.join(r.workdir, DONE_FILE)):
      files.remove(os.path.join(r.workdir, DONE_FILE))


def _log_start(s: start.Setup, first_step: int) -> None:
  """Logs a resume and a schedule that never decays."""
  if first_step:
    logging.info("Resuming from the checkpoint of step %d in %s.", first_step, s.workdir)
  if warning := start.schedule_warning(s.cfg):
    logging.warning(warning)


# ---- compiled steps and reporters


@dataclasses.dataclass(frozen=True)
class _Compiled:
  """The loop's compiled steps, each with its data movers (parallel.CompiledStep)."""
  train: parallel.CompiledStep  # one train step a dispatch
  multi: parallel.CompiledStep | None  # train.steps_per_dispatch steps in one scan, if > 1
  eval: parallel.CompiledStep  # the eval sums (members: each one's, [N, ...])


def _compile(s: start.Setup) -> _Compiled:
  """The group's train step, K of them in one scan, and the eval step, compiled for the parallel
  mode."""
  mode = s.cfg.parallel.mode
  train_step = s.group.train_step(lambda c: steps.make_train_step(
      c, build_model(c.model), optim.make_optimizer(c.train, c.model)))
  run = parallel.compile_train_step(train_step, mode, s.mesh, s.shardings)
  multi = (parallel.compile_multi_step(steps.scan_steps(train_step), s.mesh, s.shardings)
           if s.cfg.train.steps_per_dispatch > 1 else None)
  eval_step = scoring.make_eval_step(s.model)

  def eval_fn(state, batch):
    return eval_step(steps.eval_params(state), batch)

  run_eval = parallel.compile_eval_step(s.group.eval_step(eval_fn), mode, s.mesh, s.shardings)
  return _Compiled(run, multi, run_eval)


def _reporters(s: start.Setup, first_step: int) -> None:
  """Gives each run its reporter (one progress bar, the first run's) and its early stopping."""
  cfg = s.cfg
  fingerprint = provenance.data_fingerprint(s.task) if s.main else None
  for i, r in enumerate(s.group.runs):
    r.reporter = reporting.Reporter(
        r.workdir, r.config_dict, s.main, total_steps=cfg.train.num_steps,
        start_step=first_step, mesh_shape=dict(s.mesh.shape),
        flops_per_step=reporting.model_flops_per_step(
            cfg.model, cfg.data.batch_size, cfg.data.max_source_len, cfg.data.max_target_len),
        peak_flops_per_device=reporting.peak_flops(jax.devices()[0].device_kind, cfg.peak_flops),
        show_progress=i == 0, data=fingerprint, started=s.started)
    r.early = EarlyStopping(cfg.train, r.saved)


# ---- the loop's steps


def _dispatch(s: start.Setup, compiled: _Compiled, state: steps.TrainState, step: int, n: int
              ) -> tuple[steps.TrainState, dict[str, Any]]:
  """Runs steps step+1..step+n on the next n batches: (state, metrics still on device); first
  raises CheckpointError if an asynchronous save has failed since the last dispatch."""
  s.group.check_saves()
  batches = [next(s.train_iter) for _ in range(n)]
  for batch in batches:  # (all, non-padding) token positions, counted on the host
    seqs = [batch[k] for k in ("inputs", "targets") if batch.get(k) is not None]
    s.group.add_tokens(sum(int(np.size(x)) for x in seqs),
                       sum(int(np.count_nonzero(x)) for x in seqs))
  with reporting.maybe_profile(step, s.cfg.train, s.workdir):
    if n == 1:
      return compiled.train.step(state, compiled.train.prepare_batch(batches[0]))
    return compiled.multi.step(state, compiled.multi.prepare_batch(batches))


class _Pending:
  """The newest dispatch, checked for a divergence one dispatch late (the device runs the next
  meanwhile): one small transfer per dispatch, the finite flags; the rest only to word one."""

  def __init__(self, group: RunGroup):
    self.group = group
    self.held: tuple[int, dict[str, Any]] | None = None  # (the step after it, its metrics)

  def hold(self, step: int, metrics: dict[str, Any]) -> None:
    """Holds the dispatch that ended at `step` until the next check."""
    self.held = (step, metrics)

  def check(self) -> None:
    """Raises TrainingDiverged if the held dispatch's loss or grad norm is not finite; checks it
    once, however many points of the loop ask."""
    if self.held is not None:
      held, self.held = self.held, None
      if message := self.group.divergence(*held):
        raise TrainingDiverged(message)


def _log(s: start.Setup, step: int, window: list[dict[str, Any]]) -> None:
  """Writes the train scalars of the dispatches in `window` (one transfer): the mean loss and
  grad norm, the last learning rate (and teacher forcing), the throughput."""
  last = ["learning_rate"] + (["teacher_forcing"]
                              if s.cfg.train.scheduled_sampling.schedule != "none" else [])
  s.group.write_train_scalars(step, jax.device_get(window), last)


def _evaluate(s: start.Setup, compiled: _Compiled, state: steps.TrainState, step: int) -> bool:
  """Evaluates every run (teacher-forced sums, then decoding, its progress on the bar) and writes
  its metrics; True when early stopping asks to stop."""
  cfg, bar = s.cfg, s.group.first.reporter
  bar.evaluating()

  def decode(run: Run, state: steps.TrainState) -> dict[str, float]:
    metrics = evaluation.decode_metrics(run.cfg, s.model, steps.eval_params(state), s.task,
                                        cfg.data.eval_split, cfg.eval.num_decode_examples,
                                        progress=bar.evaluating)
    if run.cfg.eval.harness_tasks:  # lm-eval (the `eval` extra): imported by runs that name tasks
      from transformer.infer.harness import tasks as harness  # pylint: disable=g-import-not-at-top
      metrics |= harness.training_metrics(run.cfg, s.model, steps.eval_params(state), s.task,
                                          run.workdir, step)
    return metrics

  sums = eval_sums(cfg, compiled.eval, state, s.task)
  return s.group.evaluate(step, sums, compiled.train.fetch_state(state), decode)


def _save(s: start.Setup, compiled: _Compiled, state: steps.TrainState, step: int,
          stop_reason: str, evaluated: bool) -> None:
  """Starts each run's async save of `step` with its data position and metrics."""
  extra = {"train/stopped_early": 1.0} if stop_reason == "early_stop" else {}
  s.group.save(step, compiled.train.fetch_state(state), s.train_iter, evaluated, extra)


# ---- the end


def _close(s: start.Setup, preempt: preemption.PreemptionHandler) -> None:
  """However the loop ended: the checkpoints committed, then the reporters closed, the signal
  handlers restored and the prefetch thread stopped."""
  try:  # a Ctrl-C during this wait stops it: the save in flight is then never committed
    _close_all([r.ckpt.close for r in s.group.runs])
  finally:
    _close_all([r.reporter.close for r in s.group.runs])
    preempt.uninstall()
    if isinstance(s.train_iter, prefetch.Prefetch):
      s.train_iter.close()


def _close_all(closers: list[Any]) -> None:
  """Calls every closer, raising the first error after the rest; a KeyboardInterrupt stops."""
  error = None
  for close in closers:
    try:
      close()
    except Exception as e:  # pylint: disable=broad-except
      error = error or e
  if error is not None:
    raise error


def _finish(s: start.Setup, step: int, stop_reason: str) -> dict[str, float]:
  """The runs' final metrics; the done markers only now, with the last checkpoints committed (a
  stop before the last step is no end)."""
  reason = "early_stop" if stop_reason == "early_stop" else (
      "num_steps" if step >= s.cfg.train.num_steps else "")
  stopped = {stop_reason: 1.0} if stop_reason else {}
  for r in s.group.runs:
    r.final = r.final | r.last_eval | {"step": step} | stopped
    if s.main and reason:
      write_done_marker(r.workdir, step, reason, r.final, time.time() - s.started)
  return s.group.result(step) | stopped
