"""Attention masks, scaled dot-product attention (einsum or fused) and MultiHeadAttention.

Masks are boolean and broadcastable to [b, 1|n, t, s]; True means "may attend". They become a large
negative only inside `dot_product_attention`, whose logits and softmax are float32. Grouped-query
attention (num_kv_heads k < num_heads n, n = k * g) is expressed by splitting the query heads into
[k, g] in the einsum subscripts, so keys and values are never repeated: query head i uses kv head
i // g (the same grouping as jax.nn.dot_product_attention).
"""

import math
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from transformer import positional
from transformer.config import ModelConfig

Array = jax.Array
# Replaces masked logits (not added to them), so logits + bias can never overflow to -inf.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


# ----------------------------------------------------------------------------------------------------
# Masks
# ----------------------------------------------------------------------------------------------------
def make_attention_mask(query_valid: Array, key_valid: Array) -> Array:
  """[b, t] and [b, s] validity (bool or nonzero ints) -> [b, 1, t, s]: both positions valid."""
  return (query_valid.astype(bool)[:, None, :, None] & key_valid.astype(bool)[:, None, None, :])


def valid_from_lengths(lengths: Array, length: int) -> Array:
  """[b] sequence lengths -> [b, length] bool, True on the first lengths[i] positions."""
  return jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]


def causal_mask(length: int) -> Array:
  """[1, 1, t, t] lower-triangular mask: query i may attend to keys j <= i."""
  return jnp.tril(jnp.ones((length, length), bool))[None, None]


def causal_mask_from_positions(q_idx: Array, k_idx: Array) -> Array:
  """[b, t] query and [b, s] key indices (e.g. cache slots) -> [b, 1, t, s]: key index <= query index."""
  return k_idx[:, None, None, :] <= q_idx[:, None, :, None]


def segment_mask(q_segment_ids: Array, k_segment_ids: Array) -> Array:
  """[b, t] and [b, s] segment ids -> [b, 1, t, s]: same segment, and that segment is not 0 (padding)."""
  q = q_segment_ids[:, None, :, None]
  k = k_segment_ids[:, None, None, :]
  return (q == k) & (q != 0)


def prefix_lm_mask_from_positions(q_idx: Array, k_idx: Array, q_prefix: Array, k_prefix: Array,
                                  q_segment_ids: Array, k_segment_ids: Array) -> Array:
  """The prefix-LM mask for arbitrary query/key indices (decode: cache slots) -> [b, 1, t, s].

  Same nonzero segment, and either causal (k_idx <= q_idx) or both positions in the prefix.
  """
  both_prefix = q_prefix.astype(bool)[:, None, :, None] & k_prefix.astype(bool)[:, None, None, :]
  return (segment_mask(q_segment_ids, k_segment_ids)
          & (causal_mask_from_positions(q_idx, k_idx) | both_prefix))


def prefix_lm_mask(prefix: Array, segment_ids: Array) -> Array:
  """[b, t] prefix flags and segment ids -> [b, 1, t, t] self-attention prefix-LM mask.

  Causal, plus bidirectional among prefix positions; includes the segment mask (packed rows and
  padding), so it is the complete self-attention mask of a packed prefix-LM row.
  """
  idx = jnp.broadcast_to(jnp.arange(prefix.shape[1]), prefix.shape)
  return prefix_lm_mask_from_positions(idx, idx, prefix, prefix, segment_ids, segment_ids)


def combine_masks(*masks: Optional[Array]) -> Optional[Array]:
  """Logical and of the given masks (broadcasting); None entries are ignored; all None -> None."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  out = masks[0].astype(bool)
  for m in masks[1:]:
    out = out & m.astype(bool)
  return out


# ----------------------------------------------------------------------------------------------------
# Scaled dot-product attention
# ----------------------------------------------------------------------------------------------------
def _check_shapes(q, k, v, mask, bias, kv_layout):
  if kv_layout not in ('bskh', 'bksh'):
    raise ValueError(f"attention kv_layout={kv_layout!r} is not one of bskh|bksh")
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(f'attention expects q [b,t,n,h], k [b,s,k,h], v [b,s,k,hv] (or [b,k,s,*] with '
                     f'kv_layout="bksh"); got shapes {q.shape}, {k.shape}, {v.shape}')
  if (k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]):
    raise ValueError(f'attention shapes disagree: q {q.shape}, k {k.shape}, v {v.shape} '
                     f'(kv_layout={kv_layout})')
  num_kv = k.shape[2] if kv_layout == 'bskh' else k.shape[1]
  if q.shape[2] % num_kv:
    raise ValueError(f'num_kv_heads={num_kv} must divide num_heads={q.shape[2]}')
  for name, m in (('mask', mask), ('bias', bias)):
    if m is not None and (m.ndim != 4 or m.shape[1] not in (1, q.shape[2])):
      raise ValueError(f'attention {name} must be [b|1, 1|n, t|1, s|1] with n={q.shape[2]}, '
                       f'got {m.shape}')


def _grouped(x: Array, num_kv: int) -> Array:
  """[b, 1|n, t, s] -> [b, 1|k, 1|g, t, s], matching the query heads split into [k, g]."""
  if x.shape[1] == 1:
    return x[:, :, None]
  return x.reshape(x.shape[0], num_kv, x.shape[1] // num_kv, *x.shape[2:])


def _einsum_attention(q, k, v, mask, bias, dropout_rate, dropout_rng, deterministic, kv_layout):
  """Reference path: returns out [b, t, n, hv] and float32 weights [b, n, t, s].

  k, v are [b, s, k, *] or, with kv_layout='bksh', [b, k, s, *]: the KV-cache layout, in which the
  batched dims (b, k) lead, so XLA runs both einsums on the cache without transposing it.
  """
  b, t, n, h = q.shape
  num_kv, s = (k.shape[2], k.shape[1]) if kv_layout == 'bskh' else k.shape[1:3]
  qg = q.reshape(b, t, num_kv, n // num_kv, h)  # [b, t, k, g, h]
  logits = jnp.einsum(f'btkgh,{kv_layout}->bkgts', qg, k, preferred_element_type=jnp.float32)
  logits = logits * (1.0 / math.sqrt(h))
  if bias is not None:
    logits = logits + _grouped(bias, num_kv).astype(jnp.float32)
  if mask is not None:
    gmask = _grouped(mask, num_kv)
    logits = jnp.where(gmask, logits, _MASK_VALUE)
  weights = jax.nn.softmax(logits, axis=-1)  # [b, k, g, t, s] float32
  if mask is not None:
    # A fully masked row would otherwise be uniform over garbage keys; make it exactly zero.
    weights = jnp.where(gmask, weights, 0.0)
  if not deterministic and dropout_rate > 0.0:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, weights.shape)
    weights = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
  out = jnp.einsum(f'bkgts,{kv_layout}->btkgh', weights.astype(v.dtype), v)
  return out.reshape(b, t, n, v.shape[-1]), weights.reshape(b, n, t, s)


def _fused_implementation(dtype) -> Optional[str]:
  """cuDNN on GPU for half precision (its supported case); otherwise let jax pick (XLA)."""
  if jax.default_backend() == 'gpu' and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
    return 'cudnn'
  return None


def _fused_attention(q, k, v, mask, bias):
  """jax.nn.dot_product_attention, padded so that d_qk != d_v works, with zeroed fully masked rows."""
  h, hv = q.shape[-1], v.shape[-1]
  width = max(h, hv)
  # The fused kernel needs value and key head sizes equal. Zero padding is exact: padded q/k
  # features add 0 to every dot product (the scale stays 1/sqrt(h)), padded v features are sliced off.
  pad = lambda x: jnp.pad(x, [(0, 0)] * 3 + [(0, width - x.shape[-1])])
  qp, kp, vp = pad(q), pad(k), pad(v)
  if bias is not None:
    bias = bias.astype(jnp.float32)
  kwargs = dict(bias=bias, mask=mask, scale=1.0 / math.sqrt(h))
  impl = _fused_implementation(q.dtype)
  try:
    out = jax.nn.dot_product_attention(qp, kp, vp, implementation=impl, **kwargs)
  except (ValueError, NotImplementedError, TypeError):
    if impl is None:
      raise
    out = jax.nn.dot_product_attention(qp, kp, vp, implementation=None, **kwargs)  # XLA fallback
  out = out[..., :hv]
  if mask is not None:
    # jax gives a fully masked row the mean of the values; the einsum path gives zeros. Agree.
    row_valid = jnp.any(mask, axis=-1)  # [b, 1|n, t]
    out = out * jnp.transpose(row_valid, (0, 2, 1))[..., None].astype(out.dtype)
  return out


def dot_product_attention(q: Array, k: Array, v: Array, *, mask: Optional[Array] = None,
                          bias: Optional[Array] = None, dropout_rate: float = 0.0,
                          dropout_rng: Optional[Array] = None, deterministic: bool = True,
                          impl: str = 'einsum', return_weights: bool = False,
                          kv_layout: str = 'bskh'):
  """softmax(q.k / sqrt(h) + bias, masked) . v for q [b,t,n,h], k [b,s,k,h], v [b,s,k,hv].

  kv_layout='bksh' takes k [b,k,s,h], v [b,k,s,hv] instead (the KV-cache layout).
  Returns out [b, t, n, hv] (v's dtype), and float32 weights [b, n, t, s] if return_weights.
  A fully masked query row gets all-zero weights and a zero output (never NaN).
  impl='fused' uses jax.nn.dot_product_attention (cuDNN on GPU for half precision); it falls back
  to the einsum path when weights are requested or attention dropout is active, since the fused
  kernel provides neither.
  """
  _check_shapes(q, k, v, mask, bias, kv_layout)
  if impl not in ('einsum', 'fused'):
    raise ValueError(f"attention impl={impl!r} is not one of einsum|fused")
  dropout_active = not deterministic and dropout_rate > 0.0
  if dropout_active and dropout_rng is None:
    raise ValueError('attention dropout needs dropout_rng when deterministic=False')
  if impl == 'fused' and not return_weights and not dropout_active:
    if kv_layout == 'bksh':
      k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
    return _fused_attention(q, k, v, mask, bias)
  out, weights = _einsum_attention(q, k, v, mask, bias, dropout_rate, dropout_rng, deterministic,
                                   kv_layout)
  return (out, weights) if return_weights else out


# ----------------------------------------------------------------------------------------------------
# Multi-head attention
# ----------------------------------------------------------------------------------------------------
def _dense_init(num_in_axes: int, ndim: int):
  """lecun_normal over the first `num_in_axes` axes, so the scale never depends on fusion."""
  return nn.initializers.lecun_normal(in_axis=tuple(range(num_in_axes)),
                                      out_axis=tuple(range(num_in_axes, ndim)))


class Projection(nn.Module):
  """y = einsum(x, kernel) + bias contracting x's last `len(in_shape)` axes; params 'kernel', 'bias'."""
  in_shape: tuple
  out_shape: tuple
  axes: tuple  # logical names of kernel axes: in axes then out axes
  use_bias: bool = True
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """x [b, t, *in_shape] -> [b, t, *out_shape]."""
    n_in, shape = len(self.in_shape), (*self.in_shape, *self.out_shape)
    kernel = self.param('kernel', nn.with_logical_partitioning(_dense_init(n_in, len(shape)),
                                                               self.axes), shape, self.param_dtype)
    letters = 'cdefghijklmnopqrsuvwxyz'  # not b, t
    ins, outs = letters[:n_in], letters[n_in:len(shape)]
    y = jnp.einsum(f'bt{ins},{ins}{outs}->bt{outs}', x.astype(self.dtype),
                   jnp.asarray(kernel, self.dtype))
    if self.use_bias:
      bias = self.param('bias', nn.with_logical_partitioning(nn.initializers.zeros,
                                                             self.axes[n_in:]),
                        self.out_shape, self.param_dtype)
      y = y + jnp.asarray(bias, self.dtype)
    return y


class MultiHeadAttention(nn.Module):
  """Self- or cross-attention with MHA/GQA/MQA, separate q/k and v head sizes, RoPE and a KV cache.

  Parameters: submodules with 'kernel' [in..., out...] and 'bias' [out...] (when config.use_bias);
  kernel shapes and logical axis names:
  - self-attention with num_kv_heads == num_heads and head_dim == v_head_dim: one fused
    `qkv` kernel [d, 3, n, h] ('embed', None, 'heads', 'head_dim');
  - otherwise `query` [d, n, h] ('embed', 'heads', 'head_dim') and, for the keys/values, one fused
    `kv` kernel [d, 2, k, h] ('embed', None, 'kv_heads', 'head_dim') when head_dim == v_head_dim,
    else `key` [d, k, h] and `value` [d, k, hv] ('embed', 'kv_heads', 'head_dim');
  - `out` [n, hv, d] ('heads', 'head_dim', 'embed').
  Decode mode keeps `cached_key` [b, k, L, h] and `cached_value` [b, k, L, hv] in the 'cache'
  collection, kv heads before slots so that attention reads the cache without transposing it:
  L = max_len (the init call's length) for self-attention, L = s (the source length) for
  cross-attention. The caller owns the cache index and the masks. A cache may have fewer rows than
  the queries: with c cache rows and b = r * c query rows, query rows i*r .. i*r+r-1 share cache
  row i (beam search: the beams of one source), and attend to it as one row of r*t queries. A
  shared self-attention cache row holds r*L slots, r regions of L, region j written by query row
  i*r+j; `slot_rows` [b, L] (which query row wrote each slot of a row's history) then masks each
  query row to its own history, so beam search reorders only slot_rows, never the keys/values.
  """
  config: ModelConfig
  cross: bool = False

  def _project(self, x, name, out_shape, out_axes):
    """x [b, t, d] -> [b, t, *out_shape] through the projection `name`."""
    cfg = self.config
    return Projection((cfg.d_model,), tuple(out_shape), ('embed', *out_axes), cfg.use_bias,
                      jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype), name=name)(x)

  def _key_value(self, kv):
    """kv [b, s, d] -> keys [b, s, k, h], values [b, s, k, hv] (no positional treatment)."""
    cfg = self.config
    k_, h, hv = cfg.num_kv_heads, cfg.head_dim, cfg.v_head_dim
    if h == hv:
      both = self._project(kv, 'kv', (2, k_, h), (None, 'kv_heads', 'head_dim'))
      return both[:, :, 0], both[:, :, 1]
    key = self._project(kv, 'key', (k_, h), ('kv_heads', 'head_dim'))
    value = self._project(kv, 'value', (k_, hv), ('kv_heads', 'head_dim'))
    return key, value

  @nn.compact
  def __call__(self, x: Array, kv: Optional[Array] = None, *, mask: Optional[Array] = None,
               bias: Optional[Array] = None, positions: Optional[Array] = None,
               kv_positions: Optional[Array] = None, deterministic: bool = True,
               decode: bool = False, cache_index: Optional[Array] = None,
               slot_rows: Optional[Array] = None) -> Array:
    """x [b, t, d] (queries), kv [b, s, d] (cross only) -> [b, t, d] in config.dtype.

    mask [b, 1|n, t, s] bool, bias [b|1, n, t, s]; in decode mode s is the cache length.
    positions [b, t] / kv_positions [b, s] feed RoPE (self-attention only; default arange).
    Decode mode (self): writes the t new keys/values at slot cache_index[0] ([b] int32, all equal)
    and attends over the whole cache (a shared cache: the slots slot_rows [b, L] allows). Decode
    mode (cross): kv given -> keys/values computed and cached; kv None -> the cached ones are used.
    """
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    n, k_, h, hv = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.v_head_dim
    x = x.astype(dtype)
    b, t = x.shape[:2]

    kv_layout = 'bskh'
    if not self.cross:
      if kv is not None:
        raise ValueError('self-attention (cross=False) takes no kv input')
      if n == k_ and h == hv:
        qkv = self._project(x, 'qkv', (3, n, h), (None, 'heads', 'head_dim'))
        query, key, value = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
      else:
        query = self._project(x, 'query', (n, h), ('heads', 'head_dim'))
        key, value = self._key_value(x)
      if cfg.positional == 'rope':
        if positions is None:
          if decode:
            raise ValueError('decode-mode self-attention with RoPE needs positions')
          positions = jnp.broadcast_to(jnp.arange(t), (b, t))
        query = positional.apply_rope(query, positions, cfg.rope_base)
        key = positional.apply_rope(key, positions if kv_positions is None else kv_positions,
                                    cfg.rope_base)
      if decode:
        key, value = self._update_self_cache(key, value, cache_index)
        kv_layout = 'bksh'
        if key.shape[0] != b:  # a shared cache (see the class docstring)
          mask, bias = _own_slots(mask, bias, slot_rows, b, key.shape[0], key.shape[2])
    else:
      query = self._project(x, 'query', (n, h), ('heads', 'head_dim'))
      if kv is not None:
        key, value = self._key_value(kv.astype(dtype))
        if decode:
          key, value = _heads_major(key), _heads_major(value)
          kv_layout = 'bksh'
          self.variable('cache', 'cached_key', lambda: key).value = key
          self.variable('cache', 'cached_value', lambda: value).value = value
      elif decode and self.has_variable('cache', 'cached_key'):
        key = self.get_variable('cache', 'cached_key')
        value = self.get_variable('cache', 'cached_value')
        kv_layout = 'bksh'
      else:
        raise ValueError('cross-attention needs kv, or decode=True with keys/values already cached')
    rows = key.shape[0]
    if rows != b:  # shared cross-attention cache rows: group the queries by row
      if not decode or rows == 0 or b % rows:
        raise ValueError(f'attention: {b} query rows cannot share {rows} key/value rows '
                         f'(decode-mode caches only, a whole number of queries per row)')
      query = query.reshape(rows, b // rows * t, n, h)
      mask = _fold_rows(mask, b, t, rows)
      bias = _fold_rows(bias, b, t, rows)

    want_weights = self.is_mutable_collection('intermediates')
    dropout_active = not deterministic and cfg.attention_dropout_rate > 0.0
    result = dot_product_attention(
        query, key, value, mask=mask, bias=bias, dropout_rate=cfg.attention_dropout_rate,
        dropout_rng=self.make_rng('dropout') if dropout_active else None,
        deterministic=deterministic, impl=cfg.attention_impl, return_weights=want_weights,
        kv_layout=kv_layout)
    out = result[0] if want_weights else result
    out = out.reshape(b, t, n, hv)  # undoes the grouping of queries by cache row (if any)
    if want_weights:
      # The fused kernel returns no weights, so dot_product_attention used the einsum path.
      weights = result[1]
      if rows != b:
        s_ = weights.shape[-1]
        weights = jnp.swapaxes(weights.reshape(rows, n, b // rows, t, s_), 1, 2)
        weights = weights.reshape(b, n, t, s_)
      self.sow('intermediates', 'attention_weights', weights)
    return Projection((n, hv), (cfg.d_model,), ('heads', 'head_dim', 'embed'), cfg.use_bias,
                      dtype, jnp.dtype(cfg.param_dtype), name='out')(out)

  def _update_self_cache(self, key, value, cache_index):
    """Writes [b, t, k, *] keys/values at cache_index[0]; returns the full [c, k, r*max_len, *] cache.

    c cache rows are shared by b = r * c query rows (r = 1 unless beams share a row, see the class
    docstring); query row i*r+j writes region j of row i. On the init call (cache not yet created) the cache is created with max_len = t, zero-filled,
    and the call attends over its own keys/values, flax-style.
    """
    key, value = _heads_major(key), _heads_major(value)  # [b, k, t, *]: only the new tokens move
    initialized = self.has_variable('cache', 'cached_key')
    cached_key = self.variable('cache', 'cached_key', jnp.zeros, key.shape, key.dtype)
    cached_value = self.variable('cache', 'cached_value', jnp.zeros, value.shape, value.dtype)
    if not initialized:
      return key, value
    if cache_index is None:
      raise ValueError('decode-mode self-attention needs cache_index ([b] int32)')
    (c, k_, slots, _), (b, _, t, _) = cached_key.value.shape, key.shape
    if c == 0 or b % c or slots % (b // c):
      raise ValueError(f'decode call with {b} rows cannot share a self-attention cache of {c} rows '
                       f'x {slots} slots')
    r = b // c
    max_len = slots // r
    if t > max_len:
      raise ValueError(f'decode call writes {t} tokens into a cache of max_len={max_len}')
    start = jnp.asarray(cache_index, jnp.int32).reshape(-1)[0]
    zero = jnp.zeros((), jnp.int32)

    def write(cache, new):  # cache [c, k, r*L, *]: query row i*r+j -> row i, slots j*L + start..
      new = new.reshape(c, r, k_, t, new.shape[-1]).astype(cache.dtype)
      for j in range(r):  # r small in-place updates (a 5-d view of the cache would be copied)
        cache = lax.dynamic_update_slice(cache, new[:, j], (zero, zero, j * max_len + start, zero))
      return cache

    cached_key.value = write(cached_key.value, key)
    cached_value.value = write(cached_value.value, value)
    return cached_key.value, cached_value.value


def _heads_major(x: Array) -> Array:
  """Keys or values [b, s, k, *] -> the cache layout [b, k, s, *]."""
  return jnp.swapaxes(x, 1, 2)


def _own_slots(mask, bias, slot_rows, b, c, slots):
  """A mask [b|1, 1, t, L] and bias [b|1, n, t, L] over a row's own history -> over the r*L slots
  of its shared cache row: slot j of region m is query row q's iff slot_rows[q, j] == q//r*r + m."""
  r = b // c
  if slot_rows is None:
    raise ValueError(f'{b} query rows share a self-attention cache of {c} rows: needs slot_rows')
  group = (jnp.arange(b, dtype=jnp.int32) // r * r)[:, None, None] + jnp.arange(r)[:, None]
  own = (slot_rows[:, None, :] == group).reshape(b, 1, 1, slots)  # [b, 1, 1, r*L]
  mask = own if mask is None else jnp.tile(mask, (1, 1, 1, r)) & own
  return mask, None if bias is None else jnp.tile(bias, (1, 1, 1, r))


def _fold_rows(x: Optional[Array], b: int, t: int, rows: int) -> Optional[Array]:
  """A mask or bias [b|1, c, t|1, s] for b query rows -> [rows, c, (b // rows) * t, s]: the
  queries of each group of b // rows consecutive rows become one row (see MultiHeadAttention)."""
  if x is None:
    return None
  x = jnp.broadcast_to(x, (b, x.shape[1], t, x.shape[3]))
  c, s = x.shape[1], x.shape[3]
  x = jnp.swapaxes(x.reshape(rows, b // rows, c, t, s), 1, 2)
  return x.reshape(rows, c, b // rows * t, s)
