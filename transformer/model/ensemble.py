"""Ensembles: several models read as one distribution, p(y | x) = (1/N) sum_i p_i(y | x), for
scoring and decoding. "models" is one module or a tuple, "params" one tree or a tuple."""

from typing import Any, Sequence

import jax
import jax.numpy as jnp


def is_ensemble(models: Any) -> bool:
  """True for a tuple (or list) of models, False for one model."""
  return isinstance(models, (tuple, list))


def members(models: Any, params: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
  """(models, params) as two tuples of equal length; one model and its tree -> 1-tuples."""
  if not is_ensemble(models):
    return (models,), (params,)
  if not models:
    raise ValueError("an ensemble needs at least one model")
  if not isinstance(params, (tuple, list)) or len(params) != len(models):
    raise ValueError(f"an ensemble of {len(models)} models needs as many parameter trees, got "
                     f"{len(params) if isinstance(params, (tuple, list)) else 'one'}")
  return tuple(models), tuple(params)


def check_compatible(configs: Sequence[Any], names: Sequence[str] | None = None) -> None:
  """ValueError (naming the member) unless the configs share arch, head, vocabularies, classes."""
  if not configs:
    raise ValueError("an ensemble needs at least one model")
  names = list(names) if names else [f"member {i}" for i in range(len(configs))]
  first = configs[0]
  keys = ["arch", "vocab_size"] + (["source_vocab_size"] if first.arch == "encoder_decoder" else [])
  keys += ["head", "num_classes"] if first.arch == "encoder_only" else []
  for name, other in zip(names[1:], configs[1:]):
    for key in keys:
      if getattr(other, key) != getattr(first, key):
        raise ValueError(f"ensemble {name} has model.{key}={getattr(other, key)!r} where "
                         f"{names[0]} has {getattr(first, key)!r}: an ensemble needs one")


def log_mean_probs(logits: Sequence[jax.Array]) -> jax.Array:
  """log((1/N) sum_i softmax(logits_i)) over the last axis, float32; one member: its logits."""
  if len(logits) == 1:
    return logits[0]
  log_probs = jnp.stack([jax.nn.log_softmax(x.astype(jnp.float32), axis=-1) for x in logits])
  return jax.nn.logsumexp(log_probs, axis=0) - jnp.log(float(len(logits)))
