"""Attention masks the tests build (the models build theirs from positions and segment ids with
attention.segment_mask and attention.prefix_lm_mask_from_positions)."""

from typing import Optional

import jax
import jax.numpy as jnp

from transformer import attention

Array = jax.Array


def make_attention_mask(query_valid: Array, key_valid: Array) -> Array:
  """[b, t] and [b, s] validity (bool or nonzero ints) -> [b, 1, t, s]: both positions valid."""
  return (query_valid.astype(bool)[:, None, :, None] & key_valid.astype(bool)[:, None, None, :])


def valid_from_lengths(lengths: Array, length: int) -> Array:
  """[b] sequence lengths -> [b, length] bool, True on the first lengths[i] positions."""
  return jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]


def causal_mask(length: int) -> Array:
  """[1, 1, t, t] lower-triangular mask: query i may attend to keys j <= i."""
  return jnp.tril(jnp.ones((length, length), bool))[None, None]


def prefix_lm_mask(prefix: Array, segment_ids: Array) -> Array:
  """[b, t] prefix flags and segment ids -> [b, 1, t, t] self-attention prefix-LM mask.

  Causal, plus bidirectional among prefix positions; includes the segment mask (packed rows and
  padding), so it is the complete self-attention mask of a packed prefix-LM row.
  """
  idx = jnp.broadcast_to(jnp.arange(prefix.shape[1]), prefix.shape)
  return attention.prefix_lm_mask_from_positions(idx, idx, prefix, prefix, segment_ids,
                                                segment_ids)


def combine_masks(*masks: Optional[Array]) -> Optional[Array]:
  """Logical and of the given masks (broadcasting); None entries are ignored; all None -> None."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  out = masks[0].astype(bool)
  for m in masks[1:]:
    out = out & m.astype(bool)
  return out
