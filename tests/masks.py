"""Attention masks the tests build (the models build theirs from positions and segment ids with
attention.segment_mask and attention.prefix_lm_mask_from_positions)."""

from typing import Optional

import jax
import jax.numpy as jnp

from transformer.model import attention

Array = jax.Array


def make_attention_mask(query_valid: Array, key_valid: Array) -> Array:
  """[b, t] and [b, s] validity (bool or nonzero ints) -> [b, 1, t, s]: both positions valid."""
  return (query_valid.astype(bool)[:, None, :, None] & key_valid.astype(bool)[:, None, None, :])


def valid_from_lengths(lengths: Array, length: int) -> Array:
  """[b] sequence lengths -> [b, length] bool, True on the first lengths[i] positions."""
  return jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]


def prefix_lm_mask(prefix: Array, segment_ids: Array) -> Array:
  """[b, t] prefix flags and segment ids -> [b, 1, t, t] self-attention prefix-LM mask.

  Causal, plus bidirectional among prefix positions; includes the segment mask (packed rows and
  padding), so it is the complete self-attention mask of a packed prefix-LM row.
  """
  idx = jnp.broadcast_to(jnp.arange(prefix.shape[1]), prefix.shape)
  return attention.prefix_lm_mask_from_positions(idx, idx, prefix, prefix, segment_ids,
                                                segment_ids)


causal_mask = attention.causal_mask
combine_masks = attention.combine_masks
