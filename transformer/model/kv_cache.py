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


def is_ring(window: int, length: int) -> bool:
  """Whether a cache created for `length` tokens with model.sliding_window `window` is a ring of
  `window` slots (slot = sequence index mod window) rather than one slot per index."""
  return 0 < window <= length


class SelfAttentionCache(nn.Module):
  """A self-attention layer's `cached_key` [c, k, S, h] and `cached_value` [c, k, S, hv]; with
  `window` (model.sliding_window) <= the length it is created for, S = window slots, a ring."""
  window: int = 0

  @nn.compact
  def __call__(self, query: Array, key: Array, value: Array, mask: Optional[Array],
               bias: Optional[Array], step: DecodeStep, attend: Attend):
    """Writes keys/values [b, t, k, *] at slot step.index[0]; attends over the cache (init: t).
    A ring attends a call of t > 1 tokens over its slots before the write, then the new tokens
    (StackCache's key order), since the write may overwrite keys in the window of early ones."""
    initialized = self.has_variable("cache", "cached_key")
    key, value = jnp.swapaxes(key, 1, 2), jnp.swapaxes(value, 1, 2)  # [b, k, t, *]: new tokens
    b, k_, t = key.shape[:3]
    slots = self.window if is_ring(self.window, t) else t
    cached_key = self.variable("cache", "cached_key", jnp.zeros, (b, k_, slots, key.shape[3]),
                               key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros,
                                 (b, k_, slots, value.shape[3]), value.dtype)
    if initialized:
      if step.index is None:
        raise ValueError("decode-mode self-attention needs cache_index (DecodeStep.index, [b] "
                         "int32)")
      c = cached_key.value.shape[0]
      ring = bool(self.window) and c and b % c == 0 and (
          cached_key.value.shape[2] // (b // c) == self.window)
      if ring and t > 1:
        if c != b:
          raise ValueError(f"a sliding-window cache of {c} rows takes several tokens per call "
                           f"only for as many query rows, got {b}")
        old_key, old_value = cached_key.value, cached_value.value
        cached_key.value = _write(old_key, key, step.index, ring=True)
        cached_value.value = _write(old_value, value, step.index, ring=True)
        key = jnp.concatenate([old_key, key.astype(old_key.dtype)], axis=2)
        value = jnp.concatenate([old_value, value.astype(old_value.dtype)], axis=2)
      else:
        cached_key.value = _write(cached_key.value, key, step.index, ring)
        cached_value.value = _write(cached_value.value, value, step.index, ring)
        key, value = cached_key.value, cached_value.value
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


def _write(cache: Array, new: Array, index: Array, ring: bool = False) -> Array:
  """cache [c, k, r*L, *] with new [b, k, t, *] at slot index[0] of query row i*r+j's region;
  a ring's slot is index mod L (of t > L tokens only the last L are kept)."""
  (c, k, slots, _), (b, _, t, _) = cache.shape, new.shape
  if c == 0 or b % c or slots % (b // c):
    raise ValueError(f"decode call with {b} rows cannot share a self-attention cache of {c} rows "
                     f"x {slots} slots")
  r = b // c
  max_len = slots // r
  start = jnp.asarray(index, jnp.int32).reshape(-1)[0]
  if ring:
    return _ring_write(cache, new, start, r)
  if t > max_len:
    raise ValueError(f"decode call writes {t} tokens into a cache of max_len={max_len}")
  zero = jnp.zeros((), jnp.int32)
  new = new.reshape(c, r, k, t, new.shape[-1]).astype(cache.dtype)
  for j in range(r):  # r small in-place updates (a 5-d view of the cache would be copied)
    cache = lax.dynamic_update_slice(cache, new[:, j], (zero, zero, j * max_len + start, zero))
  return cache


def _ring_write(cache: Array, new: Array, start: Array, r: int) -> Array:
  """A ring cache [c, k, r*W, *] with new [b, k, t, *] (sequence indices start..start+t-1) at
  slots index mod W of each query row's region; t > 1 only unshared (r = 1, which
  SelfAttentionCache checks)."""
  c, k, slots, _ = cache.shape
  window, t = slots // r, new.shape[2]
  if t == 1:  # a decode step: one in-place update per region
    zero, slot = jnp.zeros((), jnp.int32), start % window
    new = new.reshape(c, r, k, 1, new.shape[-1]).astype(cache.dtype)
    for j in range(r):
      cache = lax.dynamic_update_slice(cache, new[:, j], (zero, zero, j * window + slot, zero))
    return cache
  slot_ids, keep = ring_slots(start, t, window)  # t > 1: SelfAttentionCache's rows are unshared
  return cache.at[:, :, slot_ids].set(new[:, :, t - keep:].astype(cache.dtype))


def ring_slots(start: Array, t: int, window: int) -> tuple[Array, int]:
  """(the ring slots of sequence indices start..start+t-1 that are kept, how many): each slot
  once, the last min(t, window) tokens at index mod window."""
  keep = min(t, window)
  return (start + t - keep + jnp.arange(keep, dtype=jnp.int32)) % window, keep


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
  `cached_segment_ids`, `cached_prefix` and `cached_rows` (the query row that wrote it). With
  `window` (model.sliding_window) <= the length it is created for, L = window slots, a ring whose
  `cached_indices` [b, L] hold each slot's sequence index."""
  window: int = 0

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
    ring = self.has_variable("cache", "cached_indices") if initialized else is_ring(self.window, t)
    if ring:  # each slot's sequence index (filled in by _ring)
      new["cached_indices"] = new["cached_rows"]
    slots = self.window if ring and not initialized else t
    cached = {k: self.variable("cache", k, jnp.zeros, (b, slots), jnp.int32) for k in new}
    cache_index = index.value
    if not initialized:  # init: the cache is created empty; compute as a plain forward pass.
      idx = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
      return Slots(DecodeStep(cache_index, new["cached_rows"]), idx, idx, positions, segment_ids,
                   prefix)
    if ring:
      return self._ring(cached, new, index)
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

  def _ring(self, cached: dict[str, Any], new: dict[str, Array], index: Any) -> Slots:
    """The ring's write and Slots: keys are its slots (after the write for one token; for t > 1
    the slots before it, then the new tokens, as SelfAttentionCache orders them)."""
    cache_index, t = index.value, new["cached_rows"].shape[1]
    q_idx = cache_index[:, None] + jnp.arange(t, dtype=jnp.int32)  # [b, t] sequence indices
    new["cached_indices"] = q_idx
    window = cached["cached_indices"].value.shape[1]
    slot_ids, keep = ring_slots(cache_index[0], t, window)
    old = {k: v.value for k, v in cached.items()}
    for k, value in new.items():
      cached[k].value = old[k].at[:, slot_ids].set(value[:, t - keep:].astype(jnp.int32))
    index.value = cache_index + t
    if t == 1:
      keys = {k: v.value for k, v in cached.items()}
    else:
      keys = {k: jnp.concatenate([old[k], v.astype(jnp.int32)], axis=1) for k, v in new.items()}
    return Slots(DecodeStep(cache_index, keys["cached_rows"]), q_idx, keys["cached_indices"],
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
