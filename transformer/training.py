"""Training: the train state, one jit-compiled train step, evaluation, and the loop.

Read top to bottom: `TrainState`; the model's forward on a batch; `train_step` (loss sums ->
gradients of sums -> optional psum over devices -> normalise -> optax update; scheduled sampling
from transformer/scheduled_sampling.py when configured); `eval_step`; then `train_and_evaluate`, the loop behind `train.py`.

Randomness: the state holds one PRNG key derived from `config.seed`; the step's key is
`fold_in(state.rng, state.step)`, so a run resumed from a checkpoint draws the same numbers as an
uninterrupted one. Losses are sums over tokens until the very end of the step, so gradient
accumulation and data parallelism give exactly the large batch's mean.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any, Callable, Iterable

from absl import logging
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer import files, optim, saved_runs
from transformer.config import Config, ConfigError, from_configdict, to_dict
from transformer.losses import cross_entropy
from transformer.scheduled_sampling import teacher_forcing_prob, two_pass_logits

Array = jax.Array
PyTree = Any
DONE_FILE = "train_done.json"  # in the workdir once a run has ended normally; see write_done_marker


class TrainingDiverged(RuntimeError):
  """The loss or gradient norm became NaN/Inf; the message is one line naming the step."""


@flax.struct.dataclass
class TrainState:
  """Everything a step updates; plain arrays only, so it checkpoints and shards cleanly."""
  step: Array  # int32 []: updates applied so far
  params: PyTree
  opt_state: PyTree
  rng: Array  # uint32 [2]: the run's key data (checkpoints hold no typed keys); see key_data


def key_data(key: Array) -> Array:
  """The raw uint32 data of a key: typed keys (jax.random.key, recommended) and legacy uint32
  keys (jax.random.PRNGKey) alike, so every function that takes a key accepts both."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(key)
  return jnp.asarray(key, jnp.uint32)


# ---------------------------------------------------------------------------------------------
# The model's forward on a batch.


def model_kwargs(arch: str, batch: dict[str, Any]) -> dict[str, Any]:
  """The keyword arguments of the model's __call__ for a batch (features absent -> None)."""
  g = batch.get
  if arch == "encoder_decoder":
    return dict(inputs=batch["inputs"], targets=batch["targets"],
                inputs_positions=g("inputs_positions"), inputs_segment_ids=g("inputs_segment_ids"),
                targets_positions=g("targets_positions"),
                targets_segment_ids=g("targets_segment_ids"))
  return dict(targets=batch["targets"], targets_positions=g("targets_positions"),
              targets_segment_ids=g("targets_segment_ids"), prefix_mask=g("prefix_mask"))


def target_weights(batch: dict[str, Any]) -> Array:
  """The batch's loss weights: its 'weights' feature, else 1 on non-padding targets (id != 0)."""
  weights = batch.get("weights")
  return (batch["targets"] != 0).astype(jnp.float32) if weights is None else weights


# ---------------------------------------------------------------------------------------------
# Train and eval steps.


def make_train_step(cfg: Config, model: nn.Module, tx: optax.GradientTransformation) -> Callable:
  """Returns `train_step(state, batch, rng=None, axis_name=None) -> (state, metrics)`.

  One function serves jit-over-a-mesh (axis_name None) and pmap (axis_name = the device axis,
  where the loss, weight and gradient sums are `psum`med before normalising). `rng` overrides the
  state's key (None = state.rng). Metrics stay on device: loss, weight_sum, grad_norm,
  learning_rate, teacher_forcing, finite.
  """
  arch, tc = cfg.model.arch, cfg.train
  lr_fn = optim.make_schedule(tc, d_model=cfg.model.d_model)
  use_ss = tc.scheduled_sampling.schedule != "none"
  deterministic = not (cfg.model.dropout_rate or cfg.model.attention_dropout_rate
                       or cfg.model.ffn_dropout_rate)

  def loss_sums(params, micro):
    batch, key, tf_prob = micro["batch"], micro["rng"], micro["tf_prob"]
    if use_ss:
      logits = two_pass_logits(model, arch, params, batch, tf_prob, key, deterministic)
    else:
      logits = model.apply({"params": params}, **model_kwargs(arch, batch),
                           deterministic=deterministic, rngs={"dropout": key})
    weights = target_weights(batch)
    loss_sum, _, weight_sum = cross_entropy(logits, batch["targets"], weights,
                                            label_smoothing=tc.label_smoothing, z_loss=tc.z_loss)
    return loss_sum, weight_sum

  grad_fn = jax.value_and_grad(loss_sums, has_aux=True)

  def train_step(state: TrainState, batch: dict[str, Any], rng: Array | None = None,
                 axis_name: str | None = None):
    key = jax.random.fold_in(state.rng if rng is None else rng, state.step)
    if axis_name is not None:  # a different dropout mask on every device
      key = jax.random.fold_in(key, jax.lax.axis_index(axis_name))
    tf_prob = teacher_forcing_prob(tc.scheduled_sampling, state.step)
    batch = {k: v for k, v in batch.items() if v is not None}
    n = tc.grad_accum_steps
    micro = dict(batch=optim.split_micro_batches(batch, n), rng=jax.random.split(key, n),
                 tf_prob=jnp.broadcast_to(tf_prob, (n,)))
    if n == 1:
      (loss_sum, weight_sum), grads = grad_fn(state.params, jax.tree.map(lambda x: x[0], micro))
    else:
      loss_sum, weight_sum, grads = optim.accumulate_gradients(grad_fn, state.params, micro)
    if axis_name is not None:
      loss_sum, weight_sum, grads = jax.lax.psum((loss_sum, weight_sum, grads), axis_name)
    denom = jnp.maximum(weight_sum, 1.0)
    grads = jax.tree.map(lambda g: g / denom, grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    loss, grad_norm = loss_sum / denom, optax.tree.norm(grads)
    metrics = dict(loss=loss, weight_sum=weight_sum, grad_norm=grad_norm,
                   learning_rate=lr_fn(state.step), teacher_forcing=tf_prob,
                   finite=jnp.isfinite(loss) & jnp.isfinite(grad_norm))
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics

  return train_step


def make_eval_step(cfg: Config, model: nn.Module) -> Callable:
  """Returns `eval_step(params, batch) -> sums` (unsmoothed loss, correct tokens, weight)."""
  arch = cfg.model.arch

  def eval_step(params, batch):
    batch = {k: v for k, v in batch.items() if v is not None}
    logits = model.apply({"params": params}, **model_kwargs(arch, batch), deterministic=True)
    weights = target_weights(batch)
    loss_sum, _, weight_sum = cross_entropy(logits, batch["targets"], weights)
    correct = (jnp.argmax(logits, -1) == batch["targets"]).astype(jnp.float32)
    return dict(loss_sum=loss_sum, weight_sum=weight_sum, correct_sum=jnp.sum(correct * weights))

  return eval_step


def summarize_eval(sums: dict[str, float]) -> dict[str, float]:
  """Host-side totals -> eval/loss, eval/accuracy, eval/perplexity and eval/scored_tokens (how
  many target tokens they cover: eval.num_batches may stop short of the whole split)."""
  w = max(float(sums["weight_sum"]), 1.0)
  loss = float(sums["loss_sum"]) / w
  return {"eval/loss": loss, "eval/accuracy": float(sums["correct_sum"]) / w,
          "eval/perplexity": math.exp(min(loss, 80.0)),
          "eval/scored_tokens": float(sums["weight_sum"])}


# ---------------------------------------------------------------------------------------------
# State creation.


def init_params(cfg: Config, model: nn.Module, rng: Array, example_batch: dict[str, Any],
                unbox: bool = True) -> PyTree:
  """Initial parameters from an example batch (only shapes matter); boxed keeps logical axes."""
  batch = {k: jnp.asarray(v) for k, v in example_batch.items() if v is not None}

  @jax.jit  # op-by-op init of even a tiny model takes seconds; compiled it is one call
  def init(key, batch):
    return model.init({"params": key, "dropout": key}, **model_kwargs(cfg.model.arch, batch),
                      deterministic=True)

  variables = init(rng, batch)
  return nn.meta.unbox(variables["params"]) if unbox else variables["params"]


def create_train_state(cfg: Config, model: nn.Module, rng: Array, example_batch: dict[str, Any],
                       tx: optax.GradientTransformation | None = None,
                       unbox: bool = True) -> TrainState:
  """A fresh TrainState: params from `rng`, optimizer state, step 0, the run key `rng` (as its
  uint32 data; `rng` may be a typed or a legacy key).

  With unbox=False the parameters (and their optimizer moments) keep flax's logical-axis boxes,
  which is what `jax.eval_shape` of this function should see to derive shardings.
  """
  tx = tx or optim.make_optimizer(cfg.train, d_model=cfg.model.d_model)
  batch = {k: jnp.asarray(v) for k, v in example_batch.items() if v is not None}

  @jax.jit  # one compiled call instead of seconds of op-by-op dispatch
  def create(key, batch):
    params = init_params(cfg, model, jax.random.fold_in(key, 1), batch, unbox)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=key_data(key))

  return create(rng, batch)


# ---------------------------------------------------------------------------------------------
# The loop.


def check_loop_config(cfg: Config) -> None:
  """Relations the loop needs that transformer.config cannot check alone; raises ConfigError."""
  tc = cfg.train
  if cfg.data.batch_size % tc.grad_accum_steps:
    raise ConfigError(f"data.batch_size={cfg.data.batch_size} must be divisible by "
                      f"train.grad_accum_steps={tc.grad_accum_steps}")
  for key, value in (("train.early_stop_metric", tc.early_stop_metric),
                     ("checkpoint.keep_best_by", cfg.checkpoint.keep_best_by)):
    if value and not value.startswith("eval/"):
      raise ConfigError(f"{key}={value!r} must name an evaluation metric such as 'eval/loss'")


def fill_vocab_sizes(cfg: Config, task: Any) -> Config:
  """Sets model.vocab_size/source_vocab_size written 0 from the task's tokenizers."""
  m = cfg.model
  vocab = task.target_tokenizer.vocab_size
  source = task.source_tokenizer.vocab_size if task.source_tokenizer is not None else vocab
  if m.arch == "decoder_only":  # seq2seq as a prefix-LM: source ids share the one table
    vocab = max(vocab, source)
  vocab = m.vocab_size or vocab
  return dataclasses.replace(cfg, model=dataclasses.replace(
      m, vocab_size=vocab, source_vocab_size=m.source_vocab_size or source))


def decode_metrics(cfg: Config, model: nn.Module, params: PyTree, task: Any, split: str,
                   num_examples: int = 0) -> dict[str, float]:
  """Task metrics from decoding `split` (eval/wer, eval/per or eval/bleu; {} for LMs)."""
  from transformer import evaluation  # pylint: disable=g-import-not-at-top
  return evaluation.decode_metrics(cfg, model, params, task, split, num_examples)


class _EarlyStopping:
  """Counts evaluations without improvement of `train.early_stop_metric`; state is two floats."""

  def __init__(self, tc: Any, saved: dict[str, float]):
    self.patience, self.key, self.sign = tc.early_stop_patience, tc.early_stop_metric, (
        1.0 if tc.early_stop_mode == "min" else -1.0)
    self.best = saved.get("early_stop/best", math.inf)
    self.bad = int(saved.get("early_stop/bad_evals", 0))

  def update(self, metrics: dict[str, float]) -> bool:
    """Records one evaluation; True when the run should stop."""
    if not self.patience or self.key not in metrics:
      return False
    value = self.sign * metrics[self.key]
    if value < self.best:
      self.best, self.bad = value, 0
    else:
      self.bad += 1
    return self.bad >= self.patience

  def state(self) -> dict[str, float]:
    return {"early_stop/best": self.best, "early_stop/bad_evals": float(self.bad)}


def _host_tokens(batch: dict[str, Any]) -> tuple[int, int]:
  """(all, non-padding) token positions of a host batch, counted on the host."""
  keys = [k for k in ("inputs", "targets") if batch.get(k) is not None]
  return (sum(int(np.size(batch[k])) for k in keys),
          sum(int(np.count_nonzero(batch[k])) for k in keys))


def evaluate(cfg: Config, run_eval: Any, state: Any, task: Any) -> dict[str, float]:
  """Teacher-forced loss/accuracy/perplexity over `eval.num_batches` batches of the eval split."""
  totals: dict[str, float] = {}
  batches = task.eval_batches(cfg.data.eval_split, batch_size=cfg.eval.batch_size or None)
  for i, batch in enumerate(batches):
    if cfg.eval.num_batches and i >= cfg.eval.num_batches:
      break
    sums = jax.device_get(run_eval.step(state, run_eval.prepare_batch(batch)))
    for k, v in sums.items():
      totals[k] = totals.get(k, 0.0) + float(v)
  return summarize_eval(totals) if totals else {}


def write_done_marker(workdir: str, step: int, reason: str, metrics: dict[str, float],
                      wall_seconds: float) -> None:
  """Writes `<workdir>/train_done.json` atomically: {step, reason, metrics, wall_seconds}.

  reason is 'num_steps' (train.num_steps reached) or 'early_stop'; wall_seconds is the time of the
  train_and_evaluate call that finished the run (earlier, interrupted attempts not included).
  """
  path = os.path.join(workdir, DONE_FILE)
  record = {"step": int(step), "reason": reason, "wall_seconds": round(wall_seconds, 3),
            "metrics": {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                        for k, v in metrics.items()}}
  files.write_text_atomic(path, json.dumps(record, indent=1, sort_keys=True, default=float))


def train_and_evaluate(config: Any, workdir: str, task: Any = None,
                       init_from: str = "") -> dict[str, float]:
  """Trains `config` (a ConfigDict or Config) in `workdir`, resuming from its latest checkpoint.

  `init_from` (fine-tuning): another run's workdir, e.g. one written by transformer.convert; its
  model config, tokenizers and latest parameters replace the config's and the random init
  (saved_runs.init_from_config); optimizer, schedule and data are the config's own.

  Returns the final metrics (the last evaluation, train/loss, step). `task` overrides
  `transformer.data.load_task` (tests, notebooks). Raises ConfigError, CheckpointError or
  TrainingDiverged, each with a one-line message. A run that ends at train.num_steps or stops
  early leaves `<workdir>/train_done.json` (write_done_marker); a stop before the last step or an
  error leaves none, and training further (a larger num_steps) removes it first. SIGTERM or a
  first SIGINT (checkpoints.PreemptionHandler) saves at the current step and returns with
  `preempted` or `interrupted` = 1.0 in the metrics; a second SIGINT raises KeyboardInterrupt.
  """
  from transformer import checkpoints, parallel, reporting  # pylint: disable=g-import-not-at-top
  started = time.time()
  from transformer.models import build_model  # pylint: disable=g-import-not-at-top
  cfg = config if isinstance(config, Config) else from_configdict(config)
  if init_from:
    cfg = saved_runs.init_from_config(cfg, init_from)
  check_loop_config(cfg)
  parallel.initialize_distributed(cfg.parallel)
  if task is None:
    from transformer.data import load_task  # pylint: disable=g-import-not-at-top
    from transformer.data.task import copy_tokenizers  # pylint: disable=g-import-not-at-top
    try:
      if init_from and not files.exists(os.path.join(workdir, "tokenizers")):
        copy_tokenizers(init_from, workdir)
      task = load_task(cfg, workdir)
    except (ValueError, OSError) as e:  # a missing file, an unprepared dataset, a bad size
      raise ConfigError(f"data: {str(e).strip().splitlines()[0]}") from e
  cfg = fill_vocab_sizes(cfg, task)
  if init_from and task.target_tokenizer.vocab_size > cfg.model.vocab_size:
    raise ConfigError(f"--init_from={init_from}: its model.vocab_size={cfg.model.vocab_size} is "
                      f"smaller than the tokenizer's {task.target_tokenizer.vocab_size}")
  config_dict = to_dict(cfg)
  checkpoints.check_compatible(workdir, config_dict)
  tc, mode = cfg.train, cfg.parallel.mode

  # ---- model, optimizer, mesh and the (abstract) train state
  model = build_model(cfg.model)
  tx = optim.make_optimizer(tc, d_model=cfg.model.d_model)
  example = {k: np.asarray(v)[:1] for k, v in next(iter(task.train_iterator())).items()
             if v is not None}
  rng = jax.random.PRNGKey(cfg.seed)
  init = lambda r, unbox=True: create_train_state(cfg, model, r, example, tx, unbox)  # pylint: disable=unnecessary-lambda-assignment
  mesh = parallel.make_mesh(cfg.parallel) if mode == "mesh" else None
  if mesh is not None:
    shardings = parallel.state_shardings(jax.eval_shape(lambda r: init(r, False), rng), mesh)
  else:  # pmap: the state lives on one device until prepare_state replicates it
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    shardings = jax.tree.map(lambda _: device, jax.eval_shape(init, rng))
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          jax.eval_shape(init, rng), shardings)

  ckpt = checkpoints.Checkpointer(workdir, cfg.checkpoint, config=config_dict)
  train_iter = task.train_iterator()
  saved: dict[str, float] = {}
  if ckpt.latest_step() is not None:
    state = ckpt.restore(None, abstract, data_iterator=train_iter)
    saved = ckpt.metadata()["metrics"]
  else:
    state = jax.jit(init, out_shardings=shardings)(rng)
    if init_from:
      logging.info("Fine-tuning: parameters from %s.", init_from)
      state = state.replace(params=jax.device_put(saved_runs.init_params(init_from),
                                                  shardings.params))
  start = int(state.step)
  main = parallel.is_main_process()
  done_path = os.path.join(workdir, DONE_FILE)
  if start >= tc.num_steps or saved.get("train/stopped_early"):
    logging.info("%s holds a finished run (step %d): nothing to train.", workdir, start)
    ckpt.close()
    final = {k: v for k, v in saved.items() if not k.startswith("early_stop/")} | {"step": start}
    if main and not files.exists(done_path):  # finished before markers existed
      write_done_marker(workdir, start, "early_stop" if saved.get("train/stopped_early")
                        else "num_steps", final, time.time() - started)
    return final
  if main and files.exists(done_path):  # a finished run trained further: not finished now
    files.remove(done_path)

  if start:
    logging.info("Resuming from the checkpoint of step %d in %s.", start, workdir)
  run = parallel.compile_train_step(make_train_step(cfg, model, tx), mode, mesh, shardings)
  eval_step = make_eval_step(cfg, model)
  run_eval = parallel.compile_eval_step(lambda s, b: eval_step(s.params, b), mode, mesh, shardings)
  state = run.prepare_state(state)
  global_batch = cfg.data.batch_size
  reporter = reporting.Reporter(
      workdir, config_dict, main, total_steps=tc.num_steps,
      start_step=start, mesh_shape=dict(mesh.shape) if mesh is not None else None,
      flops_per_step=reporting.model_flops_per_step(
          cfg.model, global_batch, cfg.data.max_source_len, cfg.data.max_target_len),
      peak_flops_per_device=reporting.peak_flops(jax.devices()[0].device_kind, cfg.peak_flops),
      data=reporting.data_fingerprint(task) if main else None)
  preempt = checkpoints.install_preemption_handler()
  early = _EarlyStopping(tc, saved)

  # ---- the loop: dispatch step s, then check step s-1 (a one-step lag keeps the device busy)
  step, pending, window, last_eval = start, None, [], {}
  final: dict[str, float] = {}

  def check(entry):
    s, m = entry
    if not bool(m["finite"]):
      ckpt.wait()  # the last good checkpoint stays; this state is never saved
      raise TrainingDiverged(
          f"non-finite training loss={float(m['loss'])} grad_norm={float(m['grad_norm'])} at step "
          f"{s}; stopped (last good checkpoint: step {ckpt.latest_step()} in {ckpt.directory})")

  try:
    stop_reason = ""
    while step < tc.num_steps:
      batch = next(train_iter)
      reporter.add_tokens(*_host_tokens(batch))
      with reporting.maybe_profile(step, tc, workdir):
        state, metrics = run.step(state, run.prepare_batch(batch))
      step += 1
      if pending is not None:
        check(pending)
      pending = (step, metrics)
      window.append(metrics)
      reporter.progress(step)
      if step % tc.log_every_steps == 0 or step == tc.num_steps:
        check(pending)
        fetched = jax.device_get(window)
        window = []
        scalars = {f"train/{k}": float(np.mean([m[k] for m in fetched]))
                   for k in ("loss", "grad_norm")}
        scalars["train/learning_rate"] = float(fetched[-1]["learning_rate"])
        if tc.scheduled_sampling.schedule != "none":
          scalars["train/teacher_forcing"] = float(fetched[-1]["teacher_forcing"])
        reporter.write_scalars(step, scalars | reporter.throughput())
        final |= scalars
      evaluated = step % cfg.eval.every_steps == 0 or step == tc.num_steps
      if evaluated:
        check(pending)
        last_eval = evaluate(cfg, run_eval, state, task)
        last_eval |= decode_metrics(cfg, model, run.fetch_state(state).params, task,
                                    cfg.data.eval_split, cfg.eval.num_decode_examples)
        reporter.write_scalars(step, last_eval)
        reporter.reset_throughput()
        if early.update(last_eval):
          stop_reason = "early_stop"
      # Asked every step (multi-host: all hosts agree on the step); at num_steps it is no stop.
      if preempt.should_stop(step) and not stop_reason and step < tc.num_steps:
        stop_reason = preempt.reason  # 'interrupted' (SIGINT) or 'preempted' (SIGTERM)
      if stop_reason or step == tc.num_steps or ckpt.should_save(step):
        check(pending)
        extra = {"train/stopped_early": 1.0} if stop_reason == "early_stop" else {}
        ckpt.save(step, run.fetch_state(state), train_iter,
                  (last_eval if evaluated else {}) | early.state() | extra, force=True)
      if stop_reason:
        break
  finally:
    try:  # a Ctrl-C during this wait stops it: the save in flight is then never committed
      ckpt.close()
    finally:
      reporter.close()
      preempt.uninstall()
  final = final | last_eval | {"step": step} | ({stop_reason: 1.0} if stop_reason else {})
  # Only now, with the last checkpoint committed (close waits); a stop before the last step is
  # not an end.
  reason = "early_stop" if stop_reason == "early_stop" else (
      "num_steps" if step >= tc.num_steps else "")
  if main and reason:
    write_done_marker(workdir, step, reason, final, time.time() - started)
  return final
