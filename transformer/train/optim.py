"""Optimizers, learning-rate schedules and gradient accumulation (optax).

Step convention. optax counts updates from 0; the papers count training steps from 1. Every schedule
here is written in the paper's step `s = count + 1`, so the first update (count 0) already gets a
non-zero learning rate (no wasted step with lr 0) and warmup ends exactly at `s = warmup_steps`:

  rsqrt ("Noam", Vaswani et al. 2017, eq. 3):
      lr(s) = learning_rate * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5)
      (warmup_steps = 0 gives the pure inverse square root learning_rate * d_model^-0.5 * s^-0.5)
  warmup_cosine: peak * s / warmup while s < warmup, then
      min + (peak - min) * (1 + cos(pi * p)) / 2,  p = (s - warmup) / (num_steps - warmup) in [0, 1]
  warmup_linear: the same warmup, then peak + (min - peak) * p
  constant: peak * min(1, s / warmup)
where peak = train.learning_rate and min = train.min_learning_rate_ratio * peak. The decays reach
`min` at s = num_steps (the last update) and stay there if training runs longer. A run with
num_steps <= warmup_steps (a config shortened for a smoke run) ends inside the warmup: its learning
rate only ramps, as the full run's first num_steps steps would.

Optimizers (`train.optimizer`), chained as clip -> [L2] -> preconditioner -> [decay] -> -lr; clip
and decay become identity placeholders when off, so the state tree does not depend on them:
  adam      optax.scale_by_adam(b1, b2, eps); weight_decay > 0 adds the classical L2 term
            weight_decay * param to the *gradient* (coupled, before Adam's preconditioning).
  adamw     Adam plus decoupled weight decay (Loshchilov & Hutter): update += weight_decay * param
            after preconditioning, then scaled by the learning rate (optax.adamw's convention).
  adafactor factored second moments (optax defaults: decay 0.8, block-RMS clipping at 1.0, updates
            scaled by the parameter RMS); b1/b2/eps are ignored; decoupled weight decay as adamw.
  sgd       heavy-ball momentum `train.momentum` (0 = plain SGD); decoupled weight decay as adamw.
Global-norm clipping is applied to the raw gradients when `train.grad_clip > 0`.

Weight-decay mask (by parameter *names*, never by rank, so it also holds for scanned layers whose
parameters carry a leading 'layers' axis):
  * a norm scale or bias: the leaf is named 'scale' or 'bias', or any enclosing module name
    contains 'norm' (LayerNorm_0, RMSNorm, pre_attention_norm, ...): decayed only if
    `train.weight_decay_norms_and_biases`;
  * an embedding: the leaf is named 'embedding' or any module/leaf name contains 'embed' (Embed_0,
    token_embed, pos_embedding, relative position tables named *embed*): decayed only if
    `train.weight_decay_embeddings`. Tied output logits reuse the embedding, so they follow it;
  * everything else (kernels) is decayed.

Averages of parameters (the evaluation levers; steps.py and checkpoints.py use these):
  EMA (`train.ema_decay` = d > 0): a float32 copy of the parameters, initialised to them and updated
      after every optimizer update n = 1, 2, ... (n counts the updates, this one included) as
          ema <- d_n * ema + (1 - d_n) * params,   d_n = min(d, (1 + n) / (10 + n))
      The warmup of d_n (TensorFlow's ExponentialMovingAverage with num_updates) is always on: a
      long-horizon d such as 0.999 would otherwise keep the average near the random init for
      thousands of steps; from n >= (10 d - 1) / (1 - d) on (8990 for 0.999) it is the plain EMA.
  checkpoint averaging: the elementwise mean, in float32, of the same parameters of N checkpoints,
      cast back to their dtype (average_trees).
"""

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

def _peak(tc: Any) -> Any:
  """train.learning_rate: a Python float, or an array (vmapped members' rates, transformer/train/members.py)."""
  lr = tc.learning_rate
  return float(lr) if isinstance(lr, (int, float)) else jnp.asarray(lr, jnp.float32)


def _warmup(s: jax.Array, warmup: int) -> jax.Array:
  return jnp.minimum(1.0, s / warmup) if warmup > 0 else jnp.ones_like(s)


def _rsqrt(s: jax.Array, tc: Any, d_model: int) -> jax.Array:
  decay = jax.lax.rsqrt(s)
  if tc.warmup_steps > 0:
    decay = jnp.minimum(decay, s * int(tc.warmup_steps)**-1.5)
  return _peak(tc) * d_model**-0.5 * decay


def _constant(s: jax.Array, tc: Any, d_model: int) -> jax.Array:
  del d_model
  return _peak(tc) * _warmup(s, int(tc.warmup_steps))


def _warmup_then(decay: Callable[[jax.Array, float, float], jax.Array]):
  """A schedule: linear warmup to the peak, then `decay(p, peak, min)` over p in [0, 1]."""
  def schedule(s, tc, d_model):
    del d_model
    peak, warmup = _peak(tc), int(tc.warmup_steps)
    low = float(tc.min_learning_rate_ratio) * peak
    p = jnp.clip((s - warmup) / max(int(tc.num_steps) - warmup, 1), 0.0, 1.0)
    return jnp.where(s < warmup, peak * _warmup(s, warmup), decay(p, peak, low))
  return schedule


# The learning-rate schedules (train.schedule): name -> lr(s, train config, d_model), s from 1.
SCHEDULES: dict[str, Callable[[jax.Array, Any, int], jax.Array]] = {
    "rsqrt": _rsqrt,
    "warmup_cosine": _warmup_then(
        lambda p, peak, low: low + (peak - low) * 0.5 * (1.0 + jnp.cos(jnp.pi * p))),
    "warmup_linear": _warmup_then(lambda p, peak, low: peak + (low - peak) * p),
    "constant": _constant,
}


def make_schedule(train_cfg: Any, d_model: int) -> optax.Schedule:
  """Returns the learning-rate schedule `count -> lr` named by `train.schedule` (see module doc)."""
  if train_cfg.schedule not in SCHEDULES:
    raise ValueError(f"train.schedule={train_cfg.schedule!r} is not one of {', '.join(SCHEDULES)}")
  if train_cfg.warmup_steps < 0:
    raise ValueError(f"train.warmup_steps={train_cfg.warmup_steps} must be >= 0")
  fn = SCHEDULES[train_cfg.schedule]
  # The paper's step, counted from 1.
  return lambda count: fn(jnp.asarray(count, jnp.float32) + 1.0, train_cfg, d_model)


def _path_names(path) -> list[str]:
  """The dict keys along a pytree path (ignores attribute keys such as a Partitioned box's value)."""
  return [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]


def is_norm_or_bias(path) -> bool:
  """True for norm scales/biases and all biases, by name (see the module doc)."""
  names = _path_names(path)
  if not names:
    return False
  return names[-1] in ("scale", "bias") or any("norm" in n.lower() for n in names[:-1])


def is_embedding(path) -> bool:
  """True for embedding tables, by name (see the module doc)."""
  return any("embed" in n.lower() for n in _path_names(path))


def weight_decay_mask(train_cfg: Any) -> Callable[[Any], Any]:
  """Returns `params -> pytree of bools` (True = decayed) following the module doc's rules."""
  def mask(params):
    def decide(path, _):
      if is_embedding(path):
        return bool(train_cfg.weight_decay_embeddings)
      if is_norm_or_bias(path):
        return bool(train_cfg.weight_decay_norms_and_biases)
      return True
    return jax.tree_util.tree_map_with_path(decide, params)
  return mask


Transforms = list[optax.GradientTransformation]


def _adam(tc: Any, decay: optax.GradientTransformation) -> Transforms:
  # L2: added to the gradient before preconditioning.
  return [decay, optax.scale_by_adam(b1=tc.b1, b2=tc.b2, eps=tc.eps)]


def _adamw(tc: Any, decay: optax.GradientTransformation) -> Transforms:
  return [optax.scale_by_adam(b1=tc.b1, b2=tc.b2, eps=tc.eps), decay]


def _adafactor(tc: Any, decay: optax.GradientTransformation) -> Transforms:
  del tc
  return [optax.scale_by_factored_rms(), optax.clip_by_block_rms(1.0),
          optax.scale_by_param_block_rms(), decay]


def _sgd(tc: Any, decay: optax.GradientTransformation) -> Transforms:
  return ([optax.trace(decay=float(tc.momentum))] if tc.momentum > 0 else []) + [decay]


def _lion(tc: Any, decay: optax.GradientTransformation) -> Transforms:
  """Lion (Chen et al. 2023): sign(b1 m + (1 - b1) g), then m <- b2 m + (1 - b2) g."""
  return [optax.scale_by_lion(b1=tc.b1, b2=tc.b2), decay]


# The optimizers (train.optimizer): name -> its transforms between clipping and the learning rate,
# given the train config and the weight decay (decoupled decay goes after the preconditioner).
OPTIMIZERS: dict[str, Callable[[Any, optax.GradientTransformation], Transforms]] = {
    "adam": _adam, "adamw": _adamw, "adafactor": _adafactor, "sgd": _sgd, "lion": _lion}


def make_optimizer(train_cfg: Any, d_model: int) -> optax.GradientTransformation:
  """Returns the optax optimizer named by `train.optimizer` with clipping, decay and schedule."""
  name = train_cfg.optimizer
  if name not in OPTIMIZERS:
    raise ValueError(f"train.optimizer={name!r} is not one of {', '.join(OPTIMIZERS)}")
  wd = float(train_cfg.weight_decay)
  if wd < 0:
    raise ValueError(f"train.weight_decay={wd} must be >= 0")
  # Off switches are stateless placeholders with the same (empty) state as the real transform,
  # so a run may resume with another grad_clip or weight_decay (the optimizer-state tree of a
  # checkpoint must match): EmptyState for clipping, MaskedState(EmptyState) for the decay.
  mask = weight_decay_mask(train_cfg)
  decay = optax.masked(optax.add_decayed_weights(wd) if wd > 0 else optax.identity(), mask)
  clip = train_cfg.grad_clip
  return optax.chain(optax.clip_by_global_norm(float(clip)) if clip > 0 else optax.identity(),
                     *OPTIMIZERS[name](train_cfg, decay),
                     optax.scale_by_learning_rate(make_schedule(train_cfg, d_model)))


def split_micro_batches(batch: Any, num_micro: int) -> Any:
  """Reshapes every leaf [B, ...] -> [num_micro, B // num_micro, ...] (for accumulate_gradients)."""
  def split(x):
    if x.shape[0] % num_micro:
      raise ValueError(f"batch size {x.shape[0]} is not divisible by "
                       f"train.grad_accum_steps={num_micro}")
    return x.reshape((num_micro, x.shape[0] // num_micro) + x.shape[1:])
  return jax.tree.map(split, batch)


def accumulate_gradients(loss_and_grad_fn: Callable, params: Any, micro_batches: Any):
  """Sums `((loss_sum, weight_sum), grads)` of `loss_and_grad_fn(params, mb)` over micro-batches.

  `micro_batches` is a pytree whose leaves have a leading micro-batch axis (split_micro_batches;
  per-micro-batch dropout keys can ride along in it). `loss_and_grad_fn` must return *sums* over
  tokens (not means) and the gradient of that loss sum, so that dividing the totals by the total
  weight gives exactly the large batch's mean loss and gradient, whatever the padding per
  micro-batch. Runs as one `lax.scan`, so memory is that of one micro-batch.
  Returns (loss_sum, weight_sum, grads) summed over the micro-batches.
  """
  def body(carry, mb):
    (loss_sum, weight_sum), grads = loss_and_grad_fn(params, mb)
    acc_loss, acc_weight, acc_grads = carry
    return (acc_loss + loss_sum, acc_weight + weight_sum,
            jax.tree.map(jnp.add, acc_grads, grads)), None

  zeros = jax.tree.map(jnp.zeros_like, params)
  init = (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), zeros)
  (loss_sum, weight_sum, grads), _ = jax.lax.scan(body, init, micro_batches)
  return loss_sum, weight_sum, grads


def ema_decay_at(decay: float, num_updates: Any) -> jax.Array:
  """d_n = min(decay, (1 + n) / (10 + n)) for n updates (this one included); see the module doc."""
  n = jnp.asarray(num_updates, jnp.float32)
  return jnp.minimum(jnp.float32(decay), (1.0 + n) / (10.0 + n))


def update_ema(ema: Any, params: Any, decay: float, num_updates: Any) -> Any:
  """One EMA update after update number `num_updates` (from 1); `ema` and the result are float32."""
  d = ema_decay_at(decay, num_updates)
  return jax.tree.map(lambda e, p: d * e + (1.0 - d) * p.astype(jnp.float32), ema, params)
