"""Scheduled sampling for transformers (Mihaylova & Martins 2019), the two-pass method: the
teacher-forcing schedules and the second pass's logits."""

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import keyspec
from transformer.model.models import batch_segment_ids, decoder_prefix, shift_right

Array = jax.Array

# train.scheduled_sampling.schedule: name -> p(step, k, c) before the min_teacher_forcing floor.
Schedule = Callable[[Array, float, float], Array]
SCHEDULES: keyspec.Table[Schedule] = keyspec.Table("train.scheduled_sampling.schedule", {
    "none": lambda step, k, c: jnp.ones((), jnp.float32),
    "linear": lambda step, k, c: k - c * step,
    "exponential": lambda step, k, c: jnp.power(jnp.float32(k), step),
    "inverse_sigmoid": lambda step, k, c: k / (k + jnp.exp(step / k)),
})


def teacher_forcing_prob(ss_cfg: Any, step: Array) -> Array:
  """Probability of feeding the gold token at `step`, in [min_teacher_forcing, 1]."""
  p = SCHEDULES[ss_cfg.schedule](jnp.asarray(step, jnp.float32), ss_cfg.k, ss_cfg.c)
  return p if ss_cfg.schedule == "none" else jnp.clip(p, ss_cfg.min_teacher_forcing, 1.0)


def two_pass_logits(model: nn.Module, arch: str, params: Any, batch: dict[str, Any],
                    tf_prob: Array, rng: Array, deterministic: bool) -> Array:
  """Scheduled sampling's second-pass logits [b, t, v]: pass 1 decodes the gold inputs (under
  stop_gradient), each input token is replaced by pass 1's argmax with probability 1 - tf_prob
  (never padding or a decoder-only prompt), and pass 2 decodes the mixture."""
  drop1, drop2, coin = jax.random.split(rng, 3)
  variables = {"params": params}
  targets, positions = batch["targets"], batch.get("targets_positions")
  segments = batch_segment_ids(batch, "targets")
  gold_in = shift_right(targets, segments)  # exactly the model's own teacher-forced inputs
  replaceable = segments != 0
  extra: dict[str, Any] = {}
  args: tuple[Array, ...] = ()
  if arch == "encoder_decoder":
    in_segments = batch_segment_ids(batch, "inputs")
    args = (model.apply(variables, batch["inputs"], inputs_positions=batch.get("inputs_positions"),
                        inputs_segment_ids=in_segments, deterministic=deterministic,
                        rngs={"dropout": drop2}, method="encode"),)  # encoded [b, s, d]
    extra["encoder_segment_ids"] = in_segments
  elif batch.get("prefix_mask") is not None:
    extra["decoder_prefix_mask"] = decoder_prefix(batch["prefix_mask"], segments)
    replaceable &= ~extra["decoder_prefix_mask"]

  def decode(tokens, key):
    return model.apply(variables, *args, tokens, decoder_positions=positions,
                       decoder_segment_ids=segments, deterministic=deterministic, decode=False,
                       rngs={"dropout": key}, method="decode", **extra)

  first = jax.lax.stop_gradient(decode(gold_in, drop1))  # [b, t, v]
  predicted_in = shift_right(jnp.argmax(first, axis=-1).astype(gold_in.dtype), segments)
  use_model = jax.random.bernoulli(coin, 1.0 - tf_prob, gold_in.shape) & replaceable
  return decode(jnp.where(use_model, predicted_in, gold_in), drop2)
