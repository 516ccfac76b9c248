"""Optimizers, learning-rate schedules, gradient accumulation and the parameter EMA (optax).

Schedules run on the paper's step s = count + 1 (optax counts from 0), so warmup ends at s = warmup.
With peak = train.learning_rate, min = train.min_learning_rate_ratio * peak and
p = (s - warmup) / (num_steps - warmup) clipped to [0, 1]:
  rsqrt (Vaswani et al. 2017, eq. 3): peak * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5)
  warmup_cosine: peak * s / warmup while s < warmup, then min + (peak - min) * (1 + cos(pi p)) / 2
  warmup_linear: the same warmup, then peak + (min - peak) * p
  constant: peak * min(1, s / warmup)
Optimizers chain clip -> [L2] -> preconditioner -> [decay] -> [µP factors] -> -lr: adam's weight decay is L2 on
the gradient, the others' decoupled. The decay mask goes by names, never rank (scanned layers
carry a leading axis): norm scales and biases (a leaf 'scale' or 'bias', a module name with 'norm')
and embeddings (a name with 'embed') decay only if train.weight_decay_* says so. The float32 EMA
(train.ema_decay = d > 0) after update n = 1, 2, ... is ema <- d_n * ema + (1 - d_n) * params,
d_n = min(d, (1 + n) / (10 + n)) (TensorFlow's warmup, so the average soon leaves the init).
"""

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from transformer import keyspec
from transformer.config import ModelConfig, TrainConfig
from transformer.model import parametrization
from transformer.train.hyper import Hyper, Scalar


def _traced(value: Scalar) -> bool:
  """True for a traced hyperparameter (hyper.py), not a Python number."""
  return not isinstance(value, (int, float))


def _peak(tc: TrainConfig, h: Hyper) -> Scalar:
  """train.learning_rate: a Python float, or a traced float32 array."""
  lr = h.get("learning_rate", tc)
  return jnp.asarray(lr, jnp.float32) if _traced(lr) else float(lr)


def _warmup_steps(tc: TrainConfig, h: Hyper) -> Scalar:
  """train.warmup_steps: a Python int, or a traced float32 array."""
  w = h.get("warmup_steps", tc)
  return jnp.asarray(w, jnp.float32) if _traced(w) else int(w)


def _warmup(s: jax.Array, warmup: Scalar) -> jax.Array:
  if _traced(warmup):  # 0 = no warmup, decided per member
    return jnp.where(warmup > 0, jnp.minimum(1.0, s / jnp.maximum(warmup, 1.0)), 1.0)
  return jnp.minimum(1.0, s / warmup) if warmup > 0 else jnp.ones_like(s)


def _rsqrt(s: jax.Array, tc: TrainConfig, h: Hyper, d_model: int) -> jax.Array:
  decay, warmup = jax.lax.rsqrt(s), _warmup_steps(tc, h)
  if _traced(warmup):
    decay = jnp.where(warmup > 0, jnp.minimum(decay, s * jnp.maximum(warmup, 1.0)**-1.5), decay)
  elif warmup > 0:
    decay = jnp.minimum(decay, s * warmup**-1.5)
  return _peak(tc, h) * d_model**-0.5 * decay


def _warmup_then(decay: Callable[[jax.Array, float, float], jax.Array]):
  """A schedule: linear warmup to the peak, then `decay(p, peak, min)` over p in [0, 1]."""
  def schedule(s, tc, h, d_model):
    del d_model
    peak, warmup = _peak(tc, h), _warmup_steps(tc, h)
    low = float(tc.min_learning_rate_ratio) * peak
    span = (jnp.maximum(int(tc.num_steps) - warmup, 1.0) if _traced(warmup)
            else max(int(tc.num_steps) - warmup, 1))
    p = jnp.clip((s - warmup) / span, 0.0, 1.0)
    return jnp.where(s < warmup, peak * _warmup(s, warmup), decay(p, peak, low))
  return schedule


# The learning-rate schedules (train.schedule): name -> lr(s, train config, traced values,
# d_model), s from 1.
Schedule = Callable[[jax.Array, TrainConfig, Hyper, int], jax.Array]
SCHEDULES: keyspec.Table[Schedule] = keyspec.Table("train.schedule", {
    "rsqrt": _rsqrt,
    "warmup_cosine": _warmup_then(
        lambda p, peak, low: low + (peak - low) * 0.5 * (1.0 + jnp.cos(jnp.pi * p))),
    "warmup_linear": _warmup_then(lambda p, peak, low: peak + (low - peak) * p),
    "constant": lambda s, tc, h, d_model: _peak(tc, h) * _warmup(s, _warmup_steps(tc, h)),
})


def make_schedule(train_cfg: TrainConfig, model: ModelConfig | int, hyper: Hyper = Hyper()
                  ) -> optax.Schedule:
  """Returns the learning-rate schedule `count -> lr` named by `train.schedule` (see module doc);
  `model`: the model config (or a standard model's d_model), whose width rsqrt reads; `hyper`'s
  traced learning_rate and warmup_steps replace the config's."""
  fn = SCHEDULES[train_cfg.schedule]
  d_model = model if isinstance(model, int) else parametrization.constants_width(model)
  return lambda count: fn(jnp.asarray(count, jnp.float32) + 1.0, train_cfg, hyper, d_model)


def weight_decay_mask(train_cfg: TrainConfig) -> Callable[[Any], Any]:
  """Returns `params -> pytree of bools` (True = decayed) following the module doc's rules."""
  def decide(path, _):
    # Dict keys only: a Partitioned box's attribute key names no module.
    names = [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]
    if any("embed" in n.lower() for n in names):
      return bool(train_cfg.weight_decay_embeddings)
    if names and (names[-1] in ("scale", "bias") or any("norm" in n.lower() for n in names[:-1])):
      return bool(train_cfg.weight_decay_norms_and_biases)
    return True
  return lambda params: jax.tree_util.tree_map_with_path(decide, params)


# train.optimizer: name -> (train config, traced values, weight decay) -> the transforms between
# clip and lr.
Optimizer = Callable[[TrainConfig, Hyper, optax.GradientTransformation],
                     list[optax.GradientTransformation]]
OPTIMIZERS: keyspec.Table[Optimizer] = keyspec.Table("train.optimizer", {
    "adam": lambda tc, h, decay: [decay, optax.scale_by_adam(
        b1=h.get("b1", tc), b2=h.get("b2", tc), eps=tc.eps)],
    "adamw": lambda tc, h, decay: [optax.scale_by_adam(
        b1=h.get("b1", tc), b2=h.get("b2", tc), eps=tc.eps), decay],
    "adafactor": lambda tc, h, decay: [optax.scale_by_factored_rms(),
                                       optax.clip_by_block_rms(1.0),
                                       optax.scale_by_param_block_rms(), decay],
    "sgd": lambda tc, h, decay: (
        [optax.trace(decay=float(tc.momentum))] if tc.momentum > 0 else []) + [decay],
    "lion": lambda tc, h, decay: [optax.scale_by_lion(  # Chen et al. 2023
        b1=h.get("b1", tc), b2=h.get("b2", tc)), decay],
})


def _decay(train_cfg: TrainConfig, h: Hyper) -> optax.GradientTransformation:
  """train.weight_decay's transform (a traced decay: always added, 0 adds nothing)."""
  wd = h.get("weight_decay", train_cfg)
  if _traced(wd):
    return optax.add_decayed_weights(jnp.asarray(wd, jnp.float32))
  return optax.add_decayed_weights(float(wd)) if wd > 0 else optax.identity()


def _clip(train_cfg: TrainConfig, h: Hyper) -> optax.GradientTransformation:
  """train.grad_clip's transform (a traced clip: 0 becomes an infinite norm, never reached)."""
  clip = h.get("grad_clip", train_cfg)
  if _traced(clip):
    clip = jnp.asarray(clip, jnp.float32)
    return optax.clip_by_global_norm(jnp.where(clip > 0, clip, jnp.inf))
  return optax.clip_by_global_norm(float(clip)) if clip > 0 else optax.identity()


def scale_by_factors(model_cfg: ModelConfig) -> optax.GradientTransformation:
  """Multiplies each update by its parameter's learning-rate factor (parametrization.py: µP's
  1/m on hidden matrices); stateless; factors of 1 leave their leaves untouched."""
  def update(updates, state, params=None):
    del params
    def scale(path, u):
      factor = parametrization.learning_rate_factor(model_cfg, parametrization.path_names(path))
      return u if factor == 1.0 else u * jnp.asarray(factor, u.dtype)
    return jax.tree_util.tree_map_with_path(scale, updates), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(train_cfg: TrainConfig, model: ModelConfig | int, hyper: Hyper = Hyper()
                   ) -> optax.GradientTransformation:
  """Returns the optax optimizer named by `train.optimizer` with clipping, decay and schedule;
  `model`: the model config (a µP model's learning-rate factors enter just before -lr), or a
  standard model's d_model; `hyper`'s traced weight_decay, grad_clip, b1, b2, learning_rate and
  warmup_steps (members.py) replace the config's."""
  transforms = OPTIMIZERS[train_cfg.optimizer]  # an unknown name: a one-line ConfigError
  # Off switches are stateless placeholders with the same (empty) state as the real transform,
  # so a run may resume with another grad_clip or weight_decay (the optimizer-state tree of a
  # checkpoint must match): EmptyState for clipping, MaskedState(EmptyState) for the decay.
  decay = optax.masked(_decay(train_cfg, hyper), weight_decay_mask(train_cfg))
  factors = ([] if isinstance(model, int) or not parametrization.is_mup(model)
             else [scale_by_factors(model)])
  return optax.chain(_clip(train_cfg, hyper), *transforms(train_cfg, hyper, decay), *factors,
                     optax.scale_by_learning_rate(make_schedule(train_cfg, model, hyper)))


def split_micro_batches(batch: Any, num_micro: int) -> Any:
  """Reshapes every leaf [B, ...] -> [num_micro, B // num_micro, ...] (for accumulate_gradients)."""
  def split(x):
    if x.shape[0] % num_micro:
      raise ValueError(f"batch size {x.shape[0]} is not divisible by "
                       f"train.grad_accum_steps={num_micro}")
    return x.reshape((num_micro, x.shape[0] // num_micro) + x.shape[1:])
  return jax.tree.map(split, batch)


def accumulate_gradients(loss_and_grad_fn: Callable, params: Any, micro_batches: Any):
  """(loss_sum, aux, grads) of `loss_and_grad_fn(params, mb) -> ((loss_sum, aux), grads)` summed
  over the leading axis of `micro_batches` in one `lax.scan`; `aux` is the weight sum (or a pytree
  of sums, such as (weight_sum, {name: sum}))."""
  def body(carry, mb):
    (loss_sum, aux), grads = loss_and_grad_fn(params, mb)
    acc_loss, acc_aux, acc_grads = carry
    return (acc_loss + loss_sum, jax.tree.map(jnp.add, acc_aux, aux),
            jax.tree.map(jnp.add, acc_grads, grads)), None

  zeros = jax.tree.map(jnp.zeros_like, params)
  first = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), micro_batches)
  aux_shapes = jax.eval_shape(loss_and_grad_fn, params, first)[0][1]  # traces no op here
  init = (jnp.zeros((), jnp.float32),
          jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), aux_shapes), zeros)
  (loss_sum, aux, grads), _ = jax.lax.scan(body, init, micro_batches)
  return loss_sum, aux, grads


def update_ema(ema: Any, params: Any, decay: float, num_updates: Any) -> Any:
  """One float32 EMA update after update number `num_updates` (from 1; the module doc's d_n)."""
  n = jnp.asarray(num_updates, jnp.float32)
  d = jnp.minimum(jnp.float32(decay), (1.0 + n) / (10.0 + n))
  return jax.tree.map(lambda e, p: d * e + (1.0 - d) * p.astype(jnp.float32), ema, params)
