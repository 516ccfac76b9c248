"""Training: the loop behind `train.py`, data -> steps -> eval -> checkpoints -> reporting (the
steps are steps.py's, the runs runs.py's). Read top to bottom, ending in `train_and_evaluate`."""

import contextlib
import dataclasses
import itertools
import json
import math
import os
import time
from typing import Any

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer import files
from transformer.config import Config, ConfigError, from_configdict
from transformer.infer import evaluation
from transformer.model import scoring
from transformer.model.models import build_model
from transformer.run import checkpoints, lock, provenance, reporting
from transformer.train import finetune, members, optim, parallel, preemption, prefetch, steps
from transformer.train import runs as runs_lib

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
  for key, value in (("train.early_stop_metric", tc.early_stop_metric),
                     ("checkpoint.keep_best_by", cfg.checkpoint.keep_best_by)):
    if value and not value.startswith("eval/"):
      raise ConfigError(f"{key}={value!r} must name an evaluation metric such as 'eval/loss'")


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
  if task is None:
    from transformer.data import load_task  # pylint: disable=g-import-not-at-top  (TFDS)
    from transformer.data.task import copy_tokenizers  # pylint: disable=g-import-not-at-top  (TFDS)
    try:
      if init_from and not files.exists(os.path.join(workdir, "tokenizers")):
        copy_tokenizers(init_from, workdir, only_source=cfg.model.arch == "encoder_only",
                        also_target=cfg.data.objective != "none")
      task = load_task(cfg, workdir)
    except (ValueError, OSError) as e:  # a missing file, an unprepared dataset, a bad size
      raise ConfigError(f"data: {str(e).strip().splitlines()[0]}") from e
  cfg = fill_vocab_sizes(cfg, task)
  input_tok = task.source_tokenizer if cfg.model.arch == "encoder_only" else task.target_tokenizer
  if init_from and input_tok.vocab_size > cfg.model.vocab_size:
    raise ConfigError(f"--init_from={init_from}: its model.vocab_size={cfg.model.vocab_size} is "
                      f"smaller than the tokenizer's {input_tok.vocab_size}")
  runs = runs_lib.runs_of(cfg, workdir)
  tc, mode = cfg.train, cfg.parallel.mode
  stacked = runs[0].index is not None  # a train.members program: states stacked [N, ...]

  model = build_model(cfg.model)
  tx = optim.make_optimizer(tc, d_model=cfg.model.d_model)
  example = {k: np.asarray(v)[:1] for k, v in next(iter(task.train_iterator())).items()
             if v is not None}
  rng = jax.random.PRNGKey(cfg.seed)
  init = lambda r, unbox=True: steps.create_train_state(cfg, model, r, example, tx, unbox)  # pylint: disable=unnecessary-lambda-assignment
  mesh = parallel.make_mesh(cfg.parallel) if mode == "mesh" else None
  if mesh is not None:  # the init traced once: boxed for the shardings, unboxed for the shapes
    boxed = jax.eval_shape(lambda r: init(r, False), rng)
    shapes, shardings = nn.meta.unbox(boxed), parallel.state_shardings(boxed, mesh)
  else:  # pmap: the state lives on one device until prepare_state replicates it
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    shapes = jax.eval_shape(init, rng)
    shardings = jax.tree.map(lambda _: device, shapes)
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          shapes, shardings)
  parallel.check_fits(abstract, cfg.model)
  if stacked:  # one state per member on a leading, unsharded axis
    shardings = jax.tree.map(lambda s: jax.sharding.NamedSharding(
        s.mesh, jax.sharding.PartitionSpec(None, *s.spec)), shardings)

  for r in runs:
    r.ckpt = checkpoints.Checkpointer(r.workdir, cfg.checkpoint, config=r.config_dict)
  train_iter = task.train_iterator()
  if cfg.data.prefetch:  # batches made ahead on a thread; checkpoints hold the loop's position
    train_iter = prefetch.Prefetch(train_iter, cfg.data.prefetch)
  state = runs_lib.restore(runs, abstract, train_iter)
  saved = runs[0].saved
  if state is not None:
    state = jax.device_put(state, shardings) if stacked else state
  elif stacked:  # each member's initial state is its separate run's: its seed's
    seeds = jnp.stack([jax.random.PRNGKey(r.cfg.seed) for r in runs])
    state = jax.jit(jax.vmap(init), out_shardings=shardings)(seeds)
  else:
    state = jax.jit(init, out_shardings=shardings)(rng)
    if init_from:
      logging.info("Fine-tuning: parameters from %s.", init_from)
      fresh = jax.device_get(state.params) if cfg.model.arch == "encoder_only" else None
      params = finetune.init_params(init_from, fresh, cfg.model.head)
      state = state.replace(params=jax.device_put(params, shardings.params))
      if state.ema_params is not None:  # the average starts where training starts; copies:
        # float32 params cast to float32 are the same buffers, which the donating step rejects
        state = state.replace(ema_params=jax.device_put(jax.tree.map(
            lambda p: jnp.array(p, jnp.float32, copy=True), state.params), shardings.ema_params))
  start = int(np.ravel(jax.device_get(state.step))[0])
  if start >= tc.num_steps or saved.get("train/stopped_early"):
    for r in runs:
      r.ckpt.close()
      r.final = ({k: v for k, v in r.saved.items() if not k.startswith("early_stop/")}
                 | {"step": start})
      if main and not files.exists(os.path.join(r.workdir, DONE_FILE)):  # finished before markers
        write_done_marker(r.workdir, start, "early_stop" if saved.get("train/stopped_early")
                          else "num_steps", r.final, time.time() - started)
    return runs_lib.result(runs, start) | {FINISHED_BEFORE: 1.0}
  for r in runs:
    if main and files.exists(os.path.join(r.workdir, DONE_FILE)):  # trained further: not finished
      files.remove(os.path.join(r.workdir, DONE_FILE))

  if start:
    logging.info("Resuming from the checkpoint of step %d in %s.", start, workdir)
  if warning := schedule_warning(cfg):
    logging.warning(warning)
  if stacked:  # members' hyperparameters traced per member; each builds its model and optimizer
    train_step = members.make_train_step(
        [r.cfg for r in runs],
        lambda c: (build_model(c.model), optim.make_optimizer(c.train, d_model=c.model.d_model)))
  else:
    train_step = steps.make_train_step(cfg, model, tx)
  run = parallel.compile_train_step(train_step, mode, mesh, shardings)
  multi = (parallel.compile_multi_step(steps.scan_steps(train_step), mesh, shardings)
           if tc.steps_per_dispatch > 1 else None)
  eval_step = scoring.make_eval_step(model)
  def eval_fn(s, b):
    return eval_step(steps.eval_params(s), b)
  run_eval = parallel.compile_eval_step(  # members: each one's sums, [N, ...]
      jax.vmap(eval_fn, in_axes=(0, None)) if stacked else eval_fn, mode, mesh, shardings)
  state = run.prepare_state(state)
  fingerprint = provenance.data_fingerprint(task) if main else None
  for i, r in enumerate(runs):  # one progress bar, the first run's
    r.reporter = reporting.Reporter(
        r.workdir, r.config_dict, main, total_steps=tc.num_steps,
        start_step=start, mesh_shape=dict(mesh.shape) if mesh is not None else None,
        flops_per_step=reporting.model_flops_per_step(
            cfg.model, cfg.data.batch_size, cfg.data.max_source_len, cfg.data.max_target_len),
        peak_flops_per_device=reporting.peak_flops(jax.devices()[0].device_kind, cfg.peak_flops),
        show_progress=i == 0, data=fingerprint, started=started)
    r.early = runs_lib.EarlyStopping(tc, r.saved)
  preempt = preemption.install_preemption_handler()

  # ---- the loop: dispatch steps s (one, or train.steps_per_dispatch in one scan), then check the
  # dispatch before it (a one-dispatch lag keeps the device busy)
  step, pending, window, stop_reason = start, None, [], ""

  def settle():  # checks the pending dispatch once, however many points below ask for it
    nonlocal pending
    if pending is None:
      return
    s, metrics = pending  # s: the step count after the dispatch
    pending = None
    # One small transfer per dispatch (the flags); the rest only to word a divergence.
    flags = jax.device_get(metrics["finite"])
    for r in runs:  # scalars, or [K] for K steps (a member: its slice)
      finite = np.ravel(r.metrics(flags))
      if not finite.all():
        m = r.metrics(jax.device_get(metrics))
        for other in runs:
          other.ckpt.wait()  # the last good checkpoints stay; this state is never saved
        i = int(np.argmin(finite))
        loss, grad_norm = (float(np.ravel(m[k])[i]) for k in ("loss", "grad_norm"))
        who, whom = (f"member {r.name}: ", f"all {len(runs)} members ") if stacked else ("", "")
        raise TrainingDiverged(
            f"{who}non-finite training loss={loss} grad_norm={grad_norm} at step "
            f"{s - finite.size + i + 1}; stopped {whom}(last checkpoint that verifies: step "
            f"{r.ckpt.latest_good_step()} in {r.ckpt.directory})")

  try:
    while step < tc.num_steps:
      n = dispatch_size(cfg, step)
      batches = [next(train_iter) for _ in range(n)]
      for batch in batches:  # (all, non-padding) token positions, counted on the host
        seqs = [batch[k] for k in ("inputs", "targets") if batch.get(k) is not None]
        tokens = (sum(int(np.size(x)) for x in seqs), sum(int(np.count_nonzero(x)) for x in seqs))
        for r in runs:
          r.reporter.add_tokens(*tokens)
      with reporting.maybe_profile(step, tc, workdir):
        if n == 1:
          state, metrics = run.step(state, run.prepare_batch(batches[0]))
        else:
          state, metrics = multi.step(state, multi.prepare_batch(batches))
      step += n
      settle()
      pending = (step, metrics)
      window.append(metrics)
      # The bar shows the loss from this process's first dispatch on (then every logged step's).
      first = (float(np.mean(runs[0].metrics(jax.device_get(metrics["loss"]))))
               if step - n == start else None)
      runs[0].reporter.progress(step, first)
      if step % tc.log_every_steps == 0 or step == tc.num_steps:
        settle()
        all_fetched, window = jax.device_get(window), []
        last = ["learning_rate"] + (["teacher_forcing"] if tc.scheduled_sampling.schedule != "none"
                                    else [])
        for r in runs:
          fetched = [r.metrics(m) for m in all_fetched]
          scalars = {f"train/{k}": float(np.mean(np.concatenate([np.ravel(m[k]) for m in fetched])))
                     for k in ("loss", "grad_norm")}
          scalars |= {f"train/{k}": float(np.ravel(fetched[-1][k])[-1]) for k in last}
          r.reporter.write_scalars(step, scalars | r.reporter.throughput())
          r.final |= scalars
      evaluated = step % cfg.eval.every_steps == 0 or step == tc.num_steps
      if evaluated:
        settle()
        sums, fetched_state = eval_sums(cfg, run_eval, state, task), run.fetch_state(state)
        for r in runs:
          r.last_eval = scoring.teacher_forced_metrics(r.item(sums), prefix="eval/") if sums else {}
          r.last_eval |= evaluation.decode_metrics(
              r.cfg, model, steps.eval_params(r.item(fetched_state)), task, cfg.data.eval_split,
              cfg.eval.num_decode_examples)
        for r in runs:  # after every decode: a throughput window counts no evaluation
          r.reporter.write_scalars(step, r.last_eval)
          r.reporter.reset_throughput()
          if r.early.update(r.last_eval):
            stop_reason = "early_stop"
      # Asked for every step (multi-host: all hosts agree on the step); at num_steps it is no stop.
      asked = [preempt.should_stop(s) for s in range(step - n + 1, step + 1)]
      if any(asked) and not stop_reason and step < tc.num_steps:
        stop_reason = preempt.reason  # 'interrupted' (SIGINT) or 'preempted' (SIGTERM)
      if stop_reason or step == tc.num_steps or runs[0].ckpt.should_save(step):
        settle()
        extra = {"train/stopped_early": 1.0} if stop_reason == "early_stop" else {}
        fetched_state = run.fetch_state(state)
        for r in runs:
          r.ckpt.save(step, r.item(fetched_state), train_iter,
                      (r.last_eval if evaluated else {}) | r.early.state() | extra, force=True)
      if stop_reason:
        break
  finally:
    try:  # a Ctrl-C during this wait stops it: the save in flight is then never committed
      _close_all([r.ckpt.close for r in runs])
    finally:
      _close_all([r.reporter.close for r in runs])
      preempt.uninstall()
      if isinstance(train_iter, prefetch.Prefetch):
        train_iter.close()
  # Only now, with the last checkpoints committed; a stop before the last step is no end.
  reason = "early_stop" if stop_reason == "early_stop" else (
      "num_steps" if step >= tc.num_steps else "")
  stopped = {stop_reason: 1.0} if stop_reason else {}
  for r in runs:
    r.final = r.final | r.last_eval | {"step": step} | stopped
    if main and reason:
      write_done_marker(r.workdir, step, reason, r.final, time.time() - started)
  return runs_lib.result(runs, step) | stopped


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
