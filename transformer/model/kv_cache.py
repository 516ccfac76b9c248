"""Decoding caches: everything that knows a cache layout. Its modules keep their 'cache'
variables in the scope of the layer or stack that shares its scope with them (nn.share_scope).

Each attention layer keeps `cached_key` [c, k, S, h] and `cached_value` [c, k, S, hv] (S: max_len
for self-attention, the source length for cross-attention); the decoder stack keeps `cache_index`
[b] and `cached_positions`, `cached_segment_ids`, `cached_prefix`, `cached_rows` [b, L]. Batch on
axis 0 (axis 1 under scan_layers' 'layers'). Shared beam rows: with b = r * c query rows, rows
i*r .. i*r+r-1 share cache row i, whose self-attention keys/values hold r regions of L slots
(region j written by query row i*r+j); `cached_rows` masks each query row to its own history, so a
beam reorder never moves keys/values."""

from typing import Any, Callable, NamedTuple, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array
# attend(q [b,t,n,h], k [b,s,k,h], v [b,s,k,hv], mask, bias) -> (out [b,t,n,hv], weights or None)
Attend = Callable[..., tuple[Array, Optional[Array]]]


class DecodeStep(NamedTuple):
  """A decode call's first slot (`index` [b], rows equal) and each slot's writer (`slot_rows`)."""
  index: Optional[Array] = None
  slot_rows: Optional[Array] = None


class SelfAttentionCache(nn.Module):
  """A self-attention layer's `cached_key` [c, k, S, h] and `cached_value` [c, k, S, hv]."""

  @nn.compact
  def __call__(self, query: Array, key: Array, value: Array, mask: Optional[Array],
               bias: Optional[Array], step: DecodeStep, attend: Attend):
    """Writes keys/values [b, t, k, *] at slot step.index[0]; attends over the cache (init: t)."""
    initialized = self.has_variable("cache", "cached_key")
    key, value = jnp.swapaxes(key, 1, 2), jnp.swapaxes(value, 1, 2)  # [b, k, t, *]: new tokens
    cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
    if initialized:
      if step.index is None:
        raise ValueError("decode-mode self-attention needs cache_index (DecodeStep.index, [b] "
                         "int32)")
      cached_key.value = _write(cached_key.value, key, step.index)
      cached_value.value = _write(cached_value.value, value, step.index)
      key, value = cached_key.value, cached_value.value
      b, c = query.shape[0], key.shape[0]
      if c != b:
        mask, bias = _own_slots(mask, bias, step.slot_rows, b, c, key.shape[2])
    return attend_rows(attend, query, key, value, mask, bias)


class CrossAttentionCache(nn.Module):
  """A cross-attention layer's source `cached_key` [c, k, s, h] and `cached_value` [c, k, s, hv]."""

  @nn.compact
  def __call__(self, query: Array, key: Optional[Array], value: Optional[Array],
               mask: Optional[Array], bias: Optional[Array], attend: Attend):
    """Caches the source keys/values when given ([c, s, k, *]); else reads those cached. Attends."""
    if key is not None:
      key, value = jnp.swapaxes(key, 1, 2), jnp.swapaxes(value, 1, 2)
      self.variable("cache", "cached_key", lambda: key).value = key
      self.variable("cache", "cached_value", lambda: value).value = value
    elif self.has_variable("cache", "cached_key"):
      key = self.get_variable("cache", "cached_key")
      value = self.get_variable("cache", "cached_value")
    else:
      raise ValueError("cross-attention needs kv, or keys/values cached by a decode step")
    return attend_rows(attend, query, key, value, mask, bias)


def attend_rows(attend: Attend, query: Array, key: Array, value: Array, mask: Optional[Array],
                bias: Optional[Array]):
  """Queries [b, t, n, h] over cache rows [c, k, S, *], c dividing b -> (out, weights or None)."""
  (b, t, n, h), c = query.shape, key.shape[0]
  if c == 0 or b % c:
    raise ValueError(f"attention: {b} query rows cannot share {c} key/value rows "
                     f"(decode-mode caches only, a whole number of queries per row)")
  r = b // c
  if r > 1:  # shared rows: each group of r query rows becomes one row of r*t queries
    query = query.reshape(c, r * t, n, h)
    mask, bias = _fold_rows(mask, b, t, c), _fold_rows(bias, b, t, c)
  # The swap is a view for attention's [b, s, k, *]: XLA folds it into the einsum (no copy).
  out, weights = attend(query, jnp.swapaxes(key, 1, 2), jnp.swapaxes(value, 1, 2), mask, bias)
  out = out.reshape(b, t, n, value.shape[-1])
  if weights is not None and r > 1:
    s = weights.shape[-1]
    weights = jnp.swapaxes(weights.reshape(c, n, r, t, s), 1, 2).reshape(b, n, t, s)
  return out, weights


def _write(cache: Array, new: Array, index: Array) -> Array:
  """cache [c, k, r*L, *] with new [b, k, t, *] at slot index[0] of query row i*r+j's region."""
  (c, k, slots, _), (b, _, t, _) = cache.shape, new.shape
  if c == 0 or b % c or slots % (b // c):
    raise ValueError(f"decode call with {b} rows cannot share a self-attention cache of {c} rows "
                     f"x {slots} slots")
  r = b // c
  max_len = slots // r
  if t > max_len:
    raise ValueError(f"decode call writes {t} tokens into a cache of max_len={max_len}")
  start = jnp.asarray(index, jnp.int32).reshape(-1)[0]
  zero = jnp.zeros((), jnp.int32)
  new = new.reshape(c, r, k, t, new.shape[-1]).astype(cache.dtype)
  for j in range(r):  # r small in-place updates (a 5-d view of the cache would be copied)
    cache = lax.dynamic_update_slice(cache, new[:, j], (zero, zero, j * max_len + start, zero))
  return cache


def _own_slots(mask, bias, slot_rows, b, c, slots):
  """A mask [b|1, 1, t, L] and bias [b|1, n, t, L] over a row's own history -> over the r*L slots
  of its shared cache row: slot j of region m is query row q's iff slot_rows[q, j] == q//r*r + m."""
  r = b // c
  if slot_rows is None:
    raise ValueError(f"{b} query rows share a self-attention cache of {c} rows: needs slot_rows")
  group = (jnp.arange(b, dtype=jnp.int32) // r * r)[:, None, None] + jnp.arange(r)[:, None]
  own = (slot_rows[:, None, :] == group).reshape(b, 1, 1, slots)  # [b, 1, 1, r*L]
  mask = own if mask is None else jnp.tile(mask, (1, 1, 1, r)) & own
  return mask, None if bias is None else jnp.tile(bias, (1, 1, 1, r))


def _fold_rows(x: Optional[Array], b: int, t: int, rows: int) -> Optional[Array]:
  """A mask or bias [b|1, c, t|1, s] -> [rows, c, b // rows * t, s]: row groups become one row."""
  if x is None:
    return None
  x = jnp.broadcast_to(x, (b, x.shape[1], t, x.shape[3]))
  c, s = x.shape[1], x.shape[3]
  x = jnp.swapaxes(x.reshape(rows, b // rows, c, t, s), 1, 2)
  return x.reshape(rows, c, b // rows * t, s)


class Slots(NamedTuple):
  """A decode call's step, query slots [b, t], and per key slot [b, L] its index and bookkeeping."""
  step: DecodeStep
  q_idx: Array
  k_idx: Array
  k_positions: Array
  k_segment_ids: Array
  k_prefix: Array


class StackCache(nn.Module):
  """A decoder stack's bookkeeping: `cache_index` [b] and, per slot [b, L], `cached_positions`,
  `cached_segment_ids`, `cached_prefix` and `cached_rows` (the query row that wrote it)."""

  def next_positions(self, length: int) -> Optional[Array]:
    """[b, length] positions continuing the cache (its next slots); None before it exists."""
    if not self.has_variable("cache", "cache_index"):
      return None
    index = self.get_variable("cache", "cache_index")
    return index[:, None] + jnp.arange(length, dtype=jnp.int32)

  @nn.compact
  def __call__(self, positions: Array, segment_ids: Array, prefix: Array) -> Slots:
    """Writes this call's tokens' [b, t] bookkeeping at cache_index -> the call's Slots."""
    b, t = segment_ids.shape
    initialized = self.has_variable("cache", "cache_index")
    index = self.variable("cache", "cache_index", jnp.zeros, (b,), jnp.int32)
    new = {"cached_positions": positions, "cached_segment_ids": segment_ids,
           "cached_prefix": prefix.astype(jnp.int32),
           "cached_rows": jnp.broadcast_to(jnp.arange(b, dtype=jnp.int32)[:, None], (b, t))}
    cached = {k: self.variable("cache", k, jnp.zeros, (b, t), jnp.int32) for k in new}
    cache_index = index.value
    if not initialized:  # init: the cache is created empty; compute as a plain forward pass.
      idx = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
      return Slots(DecodeStep(cache_index, new["cached_rows"]), idx, idx, positions, segment_ids,
                   prefix)
    start = cache_index[0]  # all entries are equal
    for k, value in new.items():
      cached[k].value = lax.dynamic_update_slice(cached[k].value, value.astype(jnp.int32),
                                                 (jnp.int32(0), start))
    keys = {k: v.value for k, v in cached.items()}
    index.value = cache_index + t
    q_idx = cache_index[:, None] + jnp.arange(t, dtype=jnp.int32)  # [b, t] slot of each query
    length = keys["cached_positions"].shape[1]
    k_idx = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))  # [b, L]
    return Slots(DecodeStep(cache_index, keys["cached_rows"]), q_idx, k_idx,
                 keys["cached_positions"], keys["cached_segment_ids"], keys["cached_prefix"] != 0)


def empty(model: nn.Module, *args, **kwargs) -> Any:
  """The model's zeroed 'cache' collection for a full-length dummy decode call (shapes only)."""
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), *args, decode=True,
                                             method="decode"))["cache"]
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def split_cross(cache: Any) -> tuple[Any, dict[tuple[str, ...], Any]]:
  """(the cache without cross-attention keys/values, those flat): fixed after prefill."""
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(cache))
  cross = {k: v for k, v in flat.items() if "cross_attention" in k}
  rest = {k: v for k, v in flat.items() if "cross_attention" not in k}
  return flax.traverse_util.unflatten_dict(rest), cross


def join(cache: Any, cross: dict[tuple[str, ...], Any]) -> Any:
  """The full cache: `cache` plus the cross-attention keys/values split off it."""
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(cache))
  return flax.traverse_util.unflatten_dict({**flat, **cross})


def reorder(cache: Any, indices: Array, scan_layers: bool = False) -> Any:
  """Gathers every cache leaf along its batch axis (indices are clipped, not checked)."""
  def gather(path, leaf):
    return jnp.take(leaf, indices, axis=_is_self_kv(path, scan_layers)[1], mode="clip")
  return jax.tree_util.tree_map_with_path(gather, cache)


def tile_beams(cache: Any, beam_size: int, scan_layers: bool) -> Any:
  """A cache of b rows -> the beam-search cache of b*k rows sharing self-attention keys/values
  ([k, L, h] -> [k, beam_size*L, h]); the bookkeeping is repeated, `cached_rows` made row i*k's."""
  def tile(path, leaf):
    is_kv, axis = _is_self_kv(path, scan_layers)
    if is_kv:
      pad = [(0, 0)] * leaf.ndim
      pad[axis + 2] = (0, (beam_size - 1) * leaf.shape[axis + 2])
      return jnp.pad(leaf, pad)
    leaf = jnp.repeat(leaf, beam_size, axis=axis)
    return leaf * beam_size if getattr(path[-1], "key", None) == "cached_rows" else leaf
  return jax.tree_util.tree_map_with_path(tile, cache)


def reorder_beams(cache: Any, indices: Array, scan_layers: bool) -> Any:
  """`reorder` of a `tile_beams` cache: only the bookkeeping moves, shared keys/values stay."""
  def gather(path, leaf):
    is_kv, axis = _is_self_kv(path, scan_layers)
    if is_kv and leaf.shape[axis] != indices.shape[0]:
      return leaf
    return jnp.take(leaf, indices, axis=axis, mode="clip")
  return jax.tree_util.tree_map_with_path(gather, cache)


def _is_self_kv(path, scan_layers: bool) -> tuple[bool, int]:
  """(is this leaf a self-attention key/value cache, its batch axis) for a cache leaf's path."""
  names = [getattr(key, "key", None) for key in path]
  return ("self_attention" in names and names[-1] in ("cached_key", "cached_value"),
          1 if scan_layers and "layers" in names else 0)
