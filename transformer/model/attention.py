"""Attention masks, scaled dot-product attention (einsum or fused) and MultiHeadAttention.
Masks are boolean, broadcastable to [b, 1|n, t, s], True = "may attend". Grouped-query attention
splits the query heads into [k, g]: query head i uses kv head i // g, keys/values never repeated."""

import functools
import math
import operator
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import keyspec
from transformer.config import ModelConfig
from transformer.model import kv_cache, layers, parametrization, positional
from transformer.model.kernels import PLAIN, Kernels

Array = jax.Array
# Replaces masked logits (not added to them), so logits + bias can never overflow to -inf.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def causal_mask_from_positions(q_idx: Array, k_idx: Array) -> Array:
  """[b, t] query and [b, s] key indices (e.g. cache slots) -> [b, 1, t, s]: key <= query."""
  return k_idx[:, None, None, :] <= q_idx[:, None, :, None]


def causal_mask(length: int) -> Array:
  """[1, 1, t, t] lower-triangular mask: query i may attend to keys j <= i."""
  return jnp.tril(jnp.ones((length, length), bool))[None, None]


def sliding_window_mask(q_idx: Array, k_idx: Array, window: int) -> Array:
  """[b, t] query and [b, s] key indices -> [b, 1, t, s]: |query - key| < window (under a causal
  mask: the `window` most recent keys, the query's own included, as Mistral's)."""
  return jnp.abs(q_idx[:, None, :, None] - k_idx[:, None, None, :]) < window


def combine_masks(*masks: Optional[Array]) -> Optional[Array]:
  """Logical and of the given masks (broadcasting); None entries are ignored; all None -> None."""
  masks = [m for m in masks if m is not None]
  return functools.reduce(operator.and_, (m.astype(bool) for m in masks)) if masks else None


def segment_mask(q_segment_ids: Array, k_segment_ids: Array) -> Array:
  """[b, t] and [b, s] segment ids -> [b, 1, t, s]: same segment, and not 0 (padding)."""
  q = q_segment_ids[:, None, :, None]
  k = k_segment_ids[:, None, None, :]
  return (q == k) & (q != 0)


def prefix_lm_mask_from_positions(q_idx: Array, k_idx: Array, q_prefix: Array, k_prefix: Array,
                                  q_segment_ids: Array, k_segment_ids: Array) -> Array:
  """[b, 1, t, s]: same nonzero segment, and causal (k_idx <= q_idx) or both in the prefix."""
  both_prefix = q_prefix.astype(bool)[:, None, :, None] & k_prefix.astype(bool)[:, None, None, :]
  return (segment_mask(q_segment_ids, k_segment_ids)
          & (causal_mask_from_positions(q_idx, k_idx) | both_prefix))


def _check_shapes(q, k, v, mask, bias):
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(f"attention expects q [b,t,n,h], k [b,s,k,h], v [b,s,k,hv]; got shapes "
                     f"{q.shape}, {k.shape}, {v.shape}")
  if (k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]):
    raise ValueError(f"attention shapes disagree: q {q.shape}, k {k.shape}, v {v.shape}")
  if q.shape[2] % k.shape[2]:
    raise ValueError(f"num_kv_heads={k.shape[2]} must divide num_heads={q.shape[2]}")
  for name, m in (("mask", mask), ("bias", bias)):
    if m is not None and (m.ndim != 4 or m.shape[1] not in (1, q.shape[2])):
      raise ValueError(f"attention {name} must be [b|1, 1|n, t|1, s|1] with n={q.shape[2]}, "
                       f"got {m.shape}")


def _grouped(x: Array, num_kv: int) -> Array:
  """[b, 1|n, t, s] -> [b, 1|k, 1|g, t, s], matching the query heads split into [k, g]."""
  if x.shape[1] == 1:
    return x[:, :, None]
  return x.reshape(x.shape[0], num_kv, x.shape[1] // num_kv, *x.shape[2:])


def _einsum_attention(q, k, v, mask, bias, dropout_rate, dropout_rng, dropout_bits, deterministic,
                      scale):
  """Reference path: returns out [b, t, n, hv] and float32 weights [b, n, t, s]."""
  b, t, n, h = q.shape
  s, num_kv = k.shape[1:3]
  # Batched dims (b, k) first, as the dots want them; XLA cancels this against a caller's own swap
  # (the KV cache is stored [b, k, s, *]), so cached keys/values are never copied per step.
  k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # [b, k, s, *]
  qg = q.reshape(b, t, num_kv, n // num_kv, h)  # [b, t, k, g, h]
  logits = jnp.einsum("btkgh,bksh->bkgts", qg, k, preferred_element_type=jnp.float32)
  if scale != 1.0:
    logits = logits * scale
  if bias is not None:
    logits = logits + _grouped(bias, num_kv).astype(jnp.float32)
  if mask is not None:
    gmask = _grouped(mask, num_kv)
    logits = jnp.where(gmask, logits, _MASK_VALUE)
  weights = jax.nn.softmax(logits, axis=-1)  # [b, k, g, t, s] float32
  if mask is not None:
    # A fully masked row would otherwise be uniform over garbage keys; make it exactly zero.
    weights = jnp.where(gmask, weights, 0.0)
  if not deterministic and not layers.is_off(dropout_rate):
    weights = layers.dropout(weights, dropout_rate, dropout_rng, dropout_bits)
  out = jnp.einsum("bkgts,bksh->btkgh", weights.astype(v.dtype), v)
  return out.reshape(b, t, n, v.shape[-1]), weights.reshape(b, n, t, s)


def _fused_implementation(dtype) -> Optional[str]:
  """cuDNN on GPU for half precision (its supported case); otherwise let jax pick (XLA)."""
  if jax.default_backend() == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
    return "cudnn"
  return None


def _fused_attention(q, k, v, mask, bias, scale, causal=False, window=0):
  """jax.nn.dot_product_attention (is_causal=causal; a causal `window`: its local_window_size)
  with d_qk != d_v and zeroed masked rows."""
  hv = v.shape[-1]
  width = max(q.shape[-1], hv)
  # The fused kernel needs equal key and value head sizes; zero padding is exact (scale is given).
  pad = lambda x: jnp.pad(x, [(0, 0)] * 3 + [(0, width - x.shape[-1])])
  qp, kp, vp = pad(q), pad(k), pad(v)
  bias = None if bias is None else bias.astype(jnp.float32)
  kwargs = dict(bias=bias, mask=mask, scale=scale, is_causal=causal)
  if causal and window:
    kwargs["local_window_size"] = (window - 1, 0)
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
    row_valid = jnp.any(combine_masks(mask, causal_mask(q.shape[1]) if causal else None),
                        axis=-1)  # [b, 1|n, t]
    out = out * jnp.transpose(row_valid, (0, 2, 1))[..., None].astype(out.dtype)
  return out


def _einsum_output(q, k, v, mask, bias, scale):
  return _einsum_attention(q, k, v, mask, bias, 0.0, None, 32, True, scale)[0]


# model.attention_impl: name -> out(q, k, v, mask, bias, scale), without dropout or weights.
IMPLEMENTATIONS = keyspec.Table("model.attention_impl",
                              {"einsum": _einsum_output, "fused": _fused_attention})


def _causal_window_mask(length: int, window: int) -> Array:
  """causal_mask(length), and with `window` > 0 only the `window` most recent keys."""
  if not window:
    return causal_mask(length)
  idx = jnp.arange(length)[None]
  return causal_mask(length) & sliding_window_mask(idx, idx, window)


def _logits_scale(q: Array, scale_logits: bool, scale: Optional[float]) -> float:
  """`scale` if given, else 1/sqrt(h) (scale_logits) or 1."""
  if scale is not None:
    return scale
  return 1.0 / math.sqrt(q.shape[-1]) if scale_logits else 1.0


def _check_arguments(q, k, dropout_rate, dropout_rng, deterministic, causal) -> bool:
  """ValueError for a missing dropout rng or a non-square causal call; -> whether dropout acts."""
  dropout_active = not deterministic and not layers.is_off(dropout_rate)
  if dropout_active and dropout_rng is None:
    raise ValueError("attention dropout needs dropout_rng when deterministic=False")
  if causal and q.shape[1] != k.shape[1]:
    raise ValueError(f"causal attention needs as many queries as keys, got q {q.shape}, "
                     f"k {k.shape}")
  return dropout_active


def dot_product_attention(q: Array, k: Array, v: Array, *, mask: Optional[Array] = None,
                          bias: Optional[Array] = None, dropout_rate: float = 0.0,
                          dropout_rng: Optional[Array] = None, dropout_bits: int = 32,
                          deterministic: bool = True, impl: str = "einsum",
                          scale_logits: bool = True, causal: bool = False,
                          window: int = 0, scale: Optional[float] = None) -> Array:
  """softmax(q.k / sqrt(h) + bias, masked) . v for q [b,t,n,h], k [b,s,k,h], v [b,s,k,hv] ->
  out [b, t, n, hv]; a fully masked row gives zeros. scale_logits=False drops the 1/sqrt(h) (T5).
  impl='fused' falls back to einsum for dropout. causal=True (t == s) adds key j <= query i to
  `mask` (fused: by its flag), and with `window` > 0 also i - j < window (fused: its
  local_window_size). `scale` replaces the logits' scale (µP's, parametrization.attention_scale).
  `dot_product_attention_weights` also gives the weights."""
  _check_shapes(q, k, v, mask, bias)
  output = IMPLEMENTATIONS[impl]  # an unknown impl: model.attention_impl's one-line ConfigError
  dropout_active = _check_arguments(q, k, dropout_rate, dropout_rng, deterministic, causal)
  scale = _logits_scale(q, scale_logits, scale)
  if impl == "fused" and causal and not dropout_active:
    # the kernel's own causal flag and window
    return _fused_attention(q, k, v, mask, bias, scale, causal, window)
  if causal:
    mask = combine_masks(mask, _causal_window_mask(q.shape[1], window))
  if not dropout_active:
    return output(q, k, v, mask, bias, scale)
  return _einsum_attention(q, k, v, mask, bias, dropout_rate, dropout_rng, dropout_bits,
                           deterministic, scale)[0]


def dot_product_attention_weights(q: Array, k: Array, v: Array, *, mask: Optional[Array] = None,
                                  bias: Optional[Array] = None, dropout_rate: float = 0.0,
                                  dropout_rng: Optional[Array] = None, dropout_bits: int = 32,
                                  deterministic: bool = True, scale_logits: bool = True,
                                  causal: bool = False, window: int = 0,
                                  scale: Optional[float] = None) -> tuple[Array, Array]:
  """dot_product_attention's out [b, t, n, hv] and its float32 weights [b, n, t, s] (after
  dropout; zeros on masked pairs), both from the einsum path."""
  _check_shapes(q, k, v, mask, bias)
  _check_arguments(q, k, dropout_rate, dropout_rng, deterministic, causal)
  scale = _logits_scale(q, scale_logits, scale)
  if causal:
    mask = combine_masks(mask, _causal_window_mask(q.shape[1], window))
  return _einsum_attention(q, k, v, mask, bias, dropout_rate, dropout_rng, dropout_bits,
                           deterministic, scale)


def _unfolded(init: Callable, shape: tuple, axes: tuple) -> Callable:
  """nn.DenseGeneral's kernel_init or bias_init, which it calls with the parameter folded to 2-D or
  1-D: `init` of the parameter's own `shape`, boxed with its logical `axes`, so that under a mesh
  the sharding constraint sees the real rank (DenseGeneral's reshape to `shape` is then a no-op)."""
  boxed = nn.with_logical_partitioning(init, axes)
  return lambda rng, folded_shape, dtype=jnp.float32: boxed(rng, shape, dtype)


def projection(*, in_shape: tuple[int, ...], features: tuple[int, ...], axes: tuple,
               use_bias: bool, dtype: Any, param_dtype: Any, kernels: Kernels,
               name: str) -> nn.DenseGeneral:
  """nn.DenseGeneral contracting x's last axes, `in_shape`: kernel [*in, *features] with logical
  `axes` (lecun_normal over all the input axes), bias [*features]; `kernels.project` computes it
  where the backend has one."""
  n_in, out_axes = len(in_shape), axes[len(in_shape):]
  dot_general = (None if kernels.project is None
                 else functools.partial(kernels.project, out_axes=out_axes))
  lecun = nn.initializers.lecun_normal(in_axis=tuple(range(n_in)),
                                       out_axis=tuple(range(n_in, len(axes))))
  return nn.DenseGeneral(
      features, axis=tuple(range(-n_in, 0)), use_bias=use_bias, dtype=dtype,
      param_dtype=param_dtype, dot_general=dot_general,
      kernel_init=_unfolded(lecun, (*in_shape, *features), axes),
      bias_init=_unfolded(nn.initializers.zeros_init(), features, out_axes), name=name)


class MultiHeadAttention(nn.Module):
  """Self- or cross-attention with MHA/GQA/MQA, separate q/k and v head sizes, rotary encodings.

  Projections: `qkv` [d, 3, n, h] (self-attention, k == n, h == hv), else `query` [d, n, h] and
  `kv` [d, 2, k, h] (h == hv) or `key` [d, k, h] + `value` [d, k, hv]; `out` [n, hv, d].
  """
  config: ModelConfig
  cross: bool = False
  kernels: Kernels = PLAIN

  @nn.compact
  def __call__(self, x: Array, kv: Optional[Array] = None, *, mask: Optional[Array] = None,
               bias: Optional[Array] = None, positions: Optional[Array] = None,
               deterministic: bool = True,
               decode: Optional[kv_cache.DecodeStep] = None, causal: bool = False) -> Array:
    """x [b, t, d], kv [b, s, d] (cross only) -> [b, t, d]; mask [b, 1|n, t, s], bias
    [b|1, n, t, s] (decode mode: s = cache length); positions [b, t] for a rotary encoding."""
    cfg = self.config
    x = x.astype(jnp.dtype(cfg.dtype))
    query, key, value = self._project_qkv(x, kv)
    encoding = positional.encoding(cfg)
    if encoding.kind == "rotary" and not self.cross:
      if positions is None:
        if decode is not None:
          raise ValueError("decode-mode self-attention with a rotary encoding needs positions")
        positions = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
      query, key = encoding.fn(cfg, query, positions), encoding.fn(cfg, key, positions)
    if causal and (self.cross or decode is not None):
      raise ValueError("causal=True is for self-attention without a decode step")
    attend = functools.partial(self._attend, deterministic=deterministic, causal=causal)
    if decode is None:
      if key is None:
        raise ValueError("cross-attention needs kv, or keys/values cached by a decode step")
      out, weights = attend(query, key, value, mask, bias)
    elif self.cross:
      cache = kv_cache.CrossAttentionCache(name="cache")
      nn.share_scope(self, cache)  # its keys/values sit beside this layer's parameters
      out, weights = cache(query, key, value, mask, bias, attend)
    else:
      cache = kv_cache.SelfAttentionCache(cfg.sliding_window, name="cache")
      nn.share_scope(self, cache)
      out, weights = cache(query, key, value, mask, bias, decode, attend)
    if weights is not None:
      self.sow("intermediates", "attention_weights", weights)
    return projection(in_shape=(cfg.num_heads, cfg.v_head_dim), features=(cfg.d_model,),
                      axes=("heads", "head_dim", "embed"),
                      use_bias=cfg.use_bias, dtype=jnp.dtype(cfg.dtype),
                      param_dtype=jnp.dtype(cfg.param_dtype), kernels=self.kernels,
                      name="out")(out)

  def _project_qkv(self, x, kv):
    """-> query [b, t, n, h], keys [b, s, k, h], values [b, s, k, hv] (None: cross, kv None)."""
    cfg = self.config
    n, h = cfg.num_heads, cfg.head_dim
    if not self.cross:
      if kv is not None:
        raise ValueError("self-attention (cross=False) takes no kv input")
      if n == cfg.num_kv_heads and h == cfg.v_head_dim:
        qkv = self._project(x, "qkv", features=(3, n, h), out_axes=(None, "heads", "head_dim"))
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    query = self._project(x, "query", features=(n, h), out_axes=("heads", "head_dim"))
    if self.cross and kv is None:
      return query, None, None
    kv = x if kv is None else kv.astype(jnp.dtype(cfg.dtype))
    k_, hv = cfg.num_kv_heads, cfg.v_head_dim
    if h == hv:
      both = self._project(kv, "kv", features=(2, k_, h), out_axes=(None, "kv_heads", "head_dim"))
      return query, both[:, :, 0], both[:, :, 1]
    key = self._project(kv, "key", features=(k_, h), out_axes=("kv_heads", "head_dim"))
    value = self._project(kv, "value", features=(k_, hv), out_axes=("kv_heads", "head_dim"))
    return query, key, value

  def _project(self, x, name, *, features, out_axes):
    """A query/key/value projection: biased with model.use_bias or model.qkv_bias."""
    cfg = self.config
    return projection(in_shape=(cfg.d_model,), features=features, axes=("embed", *out_axes),
                      use_bias=cfg.use_bias or cfg.qkv_bias, dtype=jnp.dtype(cfg.dtype),
                      param_dtype=jnp.dtype(cfg.param_dtype), kernels=self.kernels,
                      name=name)(x)

  def _attend(self, query, key, value, mask, bias, *, deterministic, causal=False):
    """dot_product_attention with this layer's settings -> (out, weights if sown, else None)."""
    cfg = self.config
    dropout_active = not deterministic and not layers.is_off(cfg.attention_dropout_rate)
    settings = dict(mask=mask, bias=bias, dropout_rate=cfg.attention_dropout_rate,
                    dropout_rng=self.make_rng("dropout") if dropout_active else None,
                    dropout_bits=cfg.dropout_bits, deterministic=deterministic,
                    scale_logits=cfg.scale_attention_logits, causal=causal,
                    scale=parametrization.attention_scale(cfg))
    if causal and cfg.sliding_window:  # without the causal flag the window is in `mask`
      settings["window"] = cfg.sliding_window
    if self.is_mutable_collection("intermediates"):
      return dot_product_attention_weights(query, key, value, **settings)
    return dot_product_attention(query, key, value, impl=cfg.attention_impl, **settings), None
