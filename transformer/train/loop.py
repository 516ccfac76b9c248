"""Training: the loop behind `train.py`, data -> steps -> eval -> checkpoints -> reporting (the
steps are steps.py's; the runs, a plain run or train.members' members, runs.py's RunGroup). Read
top to bottom: the helpers the entry points share,
`train_and_evaluate`, then `_train`, the loop in named phases, and each phase in the order `_train`
calls it (set-up, the state to start from, compiled steps and reporters, the loop's steps, the
end)."""

import contextlib
import dataclasses
import functools
import importlib.util
import itertools
import json
import math
import os
import time
from typing import Any, Callable

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer import files
from transformer.config import Config, ConfigError, from_configdict
from transformer.infer import evaluation
from transformer.model import scoring
from transformer.model.models import build_model
from transformer.run import guard, lock, provenance, reporting, wandb_logging
from transformer.train import finetune, members, optim, parallel, preemption, prefetch, steps
from transformer.train.runs import EarlyStopping, RunGroup, runs_of

DONE_FILE = "train_done.json"  # in the workdir once a run has ended normally; see write_done_marker
FINISHED_BEFORE = "finished_before"  # a metric: the workdir held a finished run, nothing trained


class TrainingDiverged(RuntimeError):
  """The loss or gradient norm became NaN/Inf; the message is one line naming the step."""


def check_loop_config(cfg: Config) -> None:
  """Relations the loop needs that transformer.config cannot check alone; raises ConfigError."""
  tc = cfg.train
  if cfg.data.batch_size % tc.grad_accum_steps:
    raise ConfigError(f"data.batch_size={cfg.data.batch_size} must be divisible by "
                      f"train.grad_accum_steps={tc.grad_accum_steps}")
  if tc.steps_per_dispatch > 1 and cfg.parallel.mode != "mesh":
    raise ConfigError(f"train.steps_per_dispatch={tc.steps_per_dispatch} needs parallel.mode=mesh "
                      f"(got {cfg.parallel.mode!r})")
  if cfg.model.arch == "encoder_only" and cfg.model.head == "mlm" and cfg.data.objective != "mlm":
    raise ConfigError(f"model.head='mlm' trains on masked inputs: set data.objective='mlm' (got "
                      f"{cfg.data.objective!r})")
  # Before any data loads or the workdir is touched, not at the first log.
  wandb_logging.check_wandb(tc.wandb_project, tc.wandb_mode)
  if cfg.eval.harness_tasks and importlib.util.find_spec("lm_eval") is None:
    raise ConfigError(f"eval.harness_tasks={cfg.eval.harness_tasks!r} needs lm-eval: "
                      "pip install -e '.[eval]'")
  for key, value in (("train.early_stop_metric", tc.early_stop_metric),
                     ("checkpoint.keep_best_by", cfg.checkpoint.keep_best_by)):
    if value and not value.startswith("eval/"):
      raise ConfigError(f"{key}={value!r} must name an evaluation metric such as 'eval/loss'")
    if value:
      scoring.check_in_training_metric(cfg, key, value)


def schedule_warning(cfg: Config) -> str:
  """One line when a decaying schedule's warmup lasts the whole run, else ''."""
  tc = cfg.train
  if tc.schedule != "constant" and 0 < tc.num_steps <= tc.warmup_steps:
    return (f"train.num_steps={tc.num_steps} <= train.warmup_steps={tc.warmup_steps}: the run ends "
            f"inside the warmup, so train.schedule={tc.schedule!r} never decays the learning rate")
  return ""


def fill_vocab_sizes(cfg: Config, task: Any) -> Config:
  """Sets model.vocab_size/source_vocab_size written 0 from the task's tokenizers."""
  m = cfg.model
  vocab = task.target_tokenizer.vocab_size
  source = task.source_tokenizer.vocab_size if task.source_tokenizer is not None else vocab
  classes = vocab if m.arch == "encoder_only" and m.head != "mlm" else 0
  extra = getattr(task, "extra_ids", None)
  if extra is not None:  # [MASK] and sentinels after the text's ids, on both sides
    vocab = source = extra.total_vocab_size
  elif m.arch == "encoder_only":  # the encoder reads source ids; the head predicts classes
    vocab = source
  if m.arch == "decoder_only":  # seq2seq as a prefix-LM: source ids share the one table
    vocab = max(vocab, source)
  vocab = m.vocab_size or vocab
  return dataclasses.replace(cfg, model=dataclasses.replace(
      m, vocab_size=vocab, source_vocab_size=m.source_vocab_size or source,
      num_classes=m.num_classes or classes))


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
  check_loop_config(cfg)
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
    task = _load_task(cfg, workdir, init_from)
  cfg = _sized_config(cfg, task, init_from)
  s = _setup(cfg, workdir, task, main, started)
  state = _initial_state(s, init_from)
  start = int(np.ravel(jax.device_get(state.step))[0])
  tc = cfg.train
  if start >= tc.num_steps or s.group.first.saved.get("train/stopped_early"):
    return _finished_before(s, start)
  _log_start(s, start)
  compiled = _compile(s)
  state = compiled.train.prepare_state(state)
  _reporters(s, start)  # may refuse the resume (data changed since): the run is still finished
  _clear_done_markers(s)
  preempt = preemption.install_preemption_handler()

  # ---- the loop: dispatch steps (one, or train.steps_per_dispatch in one scan), then check the
  # dispatch before it (a one-dispatch lag keeps the device busy)
  step, stop_reason, window, pending = start, "", [], _Pending(s.group)
  try:
    while step < tc.num_steps:
      n = dispatch_size(cfg, step)
      state, metrics = _dispatch(s, compiled, state, step, n)
      step += n
      pending.check()  # the dispatch before, while the device runs this one
      pending.hold(step, metrics)
      window.append(metrics)
      s.group.first.reporter.progress(step, s.group.first_loss(metrics) if step - n == start
                                      else None)  # the loss: from this process's first dispatch
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


# ---- set-up


def _load_task(cfg: Config, workdir: str, init_from: str) -> Any:
  """transformer.data's task for `cfg` (fine-tuning: the run's tokenizers and converted_from.json
  copied first); a data problem is one ConfigError line."""
  from transformer.data import load_task  # pylint: disable=g-import-not-at-top  (TFDS)
  from transformer.data.task import copy_tokenizers  # pylint: disable=g-import-not-at-top  (TFDS)
  try:
    if init_from and not files.exists(os.path.join(workdir, "tokenizers")):
      copy_tokenizers(init_from, workdir, only_source=cfg.model.arch == "encoder_only",
                      also_target=cfg.data.objective != "none")
    if init_from:
      provenance.carry_converted_from(init_from, workdir)
    return load_task(cfg, workdir)
  except (ValueError, OSError) as e:  # a missing file, an unprepared dataset, a bad size
    line = str(e).strip().splitlines()[0]
    raise ConfigError(line if line.startswith("data.") else f"data: {line}") from e


def _sized_config(cfg: Config, task: Any, init_from: str) -> Config:
  """`cfg` with the vocabulary sizes of `task`'s tokenizers; a fine-tuned model's table must hold
  the tokenizer's ids."""
  cfg = fill_vocab_sizes(cfg, task)
  input_tok = task.source_tokenizer if cfg.model.arch == "encoder_only" else task.target_tokenizer
  if init_from and input_tok.vocab_size > cfg.model.vocab_size:
    raise ConfigError(f"--init_from={init_from}: its model.vocab_size={cfg.model.vocab_size} is "
                      f"smaller than the tokenizer's {input_tok.vocab_size}")
  return cfg


@dataclasses.dataclass
class _Setup:
  """What set-up gives the rest of the loop: one program training `group`'s runs."""
  cfg: Config
  workdir: str
  task: Any
  main: bool  # this process writes the runs' files
  started: float  # time.time() when train_and_evaluate was called
  group: RunGroup  # each run with its checkpointer (reporters come with _reporters)
  model: nn.Module
  tx: optax.GradientTransformation
  init: Callable[..., steps.TrainState]  # (rng, unbox=True) -> a fresh state of one run
  mesh: jax.sharding.Mesh | None  # None in pmap mode
  shardings: Any  # the group's train state's
  abstract: Any  # one run's state as jax.ShapeDtypeStructs on its shardings: restore's target
  train_iter: Any  # the training batches (a prefetch.Prefetch with data.prefetch)


def _setup(cfg: Config, workdir: str, task: Any, main: bool, started: float) -> _Setup:
  """The runs, model and optimizer, the mesh, the state's shardings and shapes (checked against
  the memory here), each run's checkpointer and the training batches."""
  group = RunGroup(runs_of(cfg, workdir))
  model = build_model(cfg.model)
  tx = optim.make_optimizer(cfg.train, cfg.model)
  example = {k: np.asarray(v)[:1] for k, v in next(iter(task.train_iterator())).items()
             if v is not None}
  init = functools.partial(steps.create_train_state, cfg, model, example_batch=example, tx=tx)
  mesh = parallel.make_mesh(cfg.parallel) if cfg.parallel.mode == "mesh" else None
  shardings, abstract = _abstract_state(init, jax.random.key(cfg.seed), mesh)
  parallel.check_fits(abstract, cfg.model)
  group.open_checkpoints(cfg.checkpoint)
  train_iter = task.train_iterator()
  if cfg.data.prefetch:  # batches made ahead on a thread; checkpoints hold the loop's position
    train_iter = prefetch.Prefetch(train_iter, cfg.data.prefetch)
  return _Setup(cfg, workdir, task, main, started, group, model, tx, init, mesh,
                group.shardings(shardings), abstract, train_iter)


def _abstract_state(init: Callable[..., steps.TrainState], rng: jax.Array,
                    mesh: jax.sharding.Mesh | None) -> tuple[Any, Any]:
  """(shardings, abstract state) of one run's train state, traced without allocating it."""
  if mesh is not None:  # the init traced once: boxed for the shardings, unboxed for the shapes
    boxed = jax.eval_shape(lambda r: init(r, unbox=False), rng)
    shapes, shardings = nn.meta.unbox(boxed), parallel.state_shardings(boxed, mesh)
  else:  # pmap: the state lives on one device until prepare_state replicates it
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    shapes = jax.eval_shape(init, rng)
    shardings = jax.tree.map(lambda _: device, shapes)
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          shapes, shardings)
  return shardings, abstract


# ---- the state to start from


def _initial_state(s: _Setup, init_from: str) -> steps.TrainState:
  """The newest checkpoints that verify (with the data position), else a fresh state: each
  member's from its own seed, a plain run's from cfg.seed (fine-tuning: the run's parameters)."""
  state = s.group.restore(s.abstract, s.shardings, s.train_iter)
  if state is not None:
    return state
  state = s.group.fresh_state(s.init, s.shardings)  # a member's is its separate run's
  return _fine_tune_start(s, state, init_from) if init_from else state


def _fine_tune_start(s: _Setup, state: steps.TrainState, init_from: str) -> steps.TrainState:
  """`state` with the parameters of the run in `init_from` (finetune.init_params)."""
  logging.info("Fine-tuning: parameters from %s.", init_from)
  fresh = jax.device_get(state.params) if s.cfg.model.arch == "encoder_only" else None
  params = finetune.init_params(init_from, fresh, s.cfg.model.head)
  state = state.replace(params=jax.device_put(params, s.shardings.params))
  if state.ema_params is not None:  # the average starts where training starts; copies:
    # float32 params cast to float32 are the same buffers, which the donating step rejects
    state = state.replace(ema_params=jax.device_put(jax.tree.map(
        lambda p: jnp.array(p, jnp.float32, copy=True), state.params), s.shardings.ema_params))
  return state


def _finished_before(s: _Setup, start: int) -> dict[str, float]:
  """A workdir whose run had ended: its saved metrics, its done markers written if missing."""
  stopped_early = s.group.first.saved.get("train/stopped_early")
  for r in s.group.runs:
    r.ckpt.close()
    r.final = ({k: v for k, v in r.saved.items() if not k.startswith("early_stop/")}
               | {"step": start})
    if s.main and not files.exists(os.path.join(r.workdir, DONE_FILE)):  # finished before markers
      write_done_marker(r.workdir, start, "early_stop" if stopped_early else "num_steps", r.final,
                        time.time() - s.started)
  return s.group.result(start) | {FINISHED_BEFORE: 1.0}


def _clear_done_markers(s: _Setup) -> None:
  """A run trained further is not finished: its DONE_FILE goes."""
  for r in s.group.runs:
    if s.main and files.exists(os.path.join(r.workdir, DONE_FILE)):
      files.remove(os.path.join(r.workdir, DONE_FILE))


def _log_start(s: _Setup, start: int) -> None:
  """Logs a resume and a schedule that never decays."""
  if start:
    logging.info("Resuming from the checkpoint of step %d in %s.", start, s.workdir)
  if warning := schedule_warning(s.cfg):
    logging.warning(warning)


# ---- compiled steps and reporters


@dataclasses.dataclass(frozen=True)
class _Compiled:
  """The loop's compiled steps, each with its data movers (parallel.CompiledStep)."""
  train: parallel.CompiledStep  # one train step a dispatch
  multi: parallel.CompiledStep | None  # train.steps_per_dispatch steps in one scan, if > 1
  eval: parallel.CompiledStep  # the eval sums (members: each one's, [N, ...])


def _compile(s: _Setup) -> _Compiled:
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


def _reporters(s: _Setup, start: int) -> None:
  """Gives each run its reporter (one progress bar, the first run's) and its early stopping."""
  cfg = s.cfg
  fingerprint = provenance.data_fingerprint(s.task) if s.main else None
  for i, r in enumerate(s.group.runs):
    r.reporter = reporting.Reporter(
        r.workdir, r.config_dict, s.main, total_steps=cfg.train.num_steps,
        start_step=start, mesh_shape=dict(s.mesh.shape) if s.mesh is not None else None,
        flops_per_step=reporting.model_flops_per_step(
            cfg.model, cfg.data.batch_size, cfg.data.max_source_len, cfg.data.max_target_len),
        peak_flops_per_device=reporting.peak_flops(jax.devices()[0].device_kind, cfg.peak_flops),
        show_progress=i == 0, data=fingerprint, started=s.started)
    r.early = EarlyStopping(cfg.train, r.saved)


# ---- the loop's steps


def _dispatch(s: _Setup, compiled: _Compiled, state: steps.TrainState, step: int, n: int
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


def _log(s: _Setup, step: int, window: list[dict[str, Any]]) -> None:
  """Writes the train scalars of the dispatches in `window` (one transfer): the mean loss and
  grad norm, the last learning rate (and teacher forcing), the throughput."""
  last = ["learning_rate"] + (["teacher_forcing"]
                              if s.cfg.train.scheduled_sampling.schedule != "none" else [])
  s.group.write_train_scalars(step, jax.device_get(window), last)


def _evaluate(s: _Setup, compiled: _Compiled, state: steps.TrainState, step: int) -> bool:
  """Evaluates every run (teacher-forced sums, then decoding, its progress on the bar) and writes
  its metrics; True when early stopping asks to stop."""
  cfg, bar = s.cfg, s.group.first.reporter
  bar.evaluating()

  def decode(run_cfg: Any, state: steps.TrainState) -> dict[str, float]:
    return evaluation.decode_metrics(run_cfg, s.model, steps.eval_params(state), s.task,
                                     cfg.data.eval_split, cfg.eval.num_decode_examples,
                                     progress=bar.evaluating)

  sums = eval_sums(cfg, compiled.eval, state, s.task)
  return s.group.evaluate(step, sums, compiled.train.fetch_state(state), decode)


def _save(s: _Setup, compiled: _Compiled, state: steps.TrainState, step: int, stop_reason: str,
          evaluated: bool) -> None:
  """Starts each run's async save of `step` with its data position and metrics."""
  extra = {"train/stopped_early": 1.0} if stop_reason == "early_stop" else {}
  s.group.save(step, compiled.train.fetch_state(state), s.train_iter, evaluated, extra)


# ---- the end


def _close(s: _Setup, preempt: preemption.PreemptionHandler) -> None:
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


def _finish(s: _Setup, step: int, stop_reason: str) -> dict[str, float]:
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
