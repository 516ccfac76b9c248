"""Positional encodings in one table, `ENCODINGS`: name -> function; each name's kind is declared in
transformer/choices.py (POSITIONALS) and the sizes it needs are checked by transformer/config.py.

The kind says where an encoding enters the model, and so the function's signature:
- 'absolute': fn(cfg, positions [b, t]) -> [b, t, d], added to the token embeddings;
- 'bias':     fn(cfg, q_positions [b, t], k_positions [b, s], bidirectional) -> [b, n, t, s]
              float32, computed once per stack and added to every layer's attention logits;
- 'rotary':   fn(cfg, x [b, t, n, h], positions [b, t]) -> queries and keys rotated;
- 'none':     nothing (the causal mask alone carries order).
Absolute and bias functions run inside `AbsoluteEncoding` and `BiasEncoding`, modules that share
their stack's scope, so a learned table ('position_embed', 'relative_bias') is the stack's."""

import dataclasses
import functools
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer import choices, keyspec

Array = jax.Array


def sinusoidal_table(length: int, d: int, max_timescale: float = 10000.0) -> Array:
  """Vaswani et al.'s [length, d] float32: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos."""
  half = -(-d // 2)  # column j has frequency j // 2; an odd d ends with a sin column
  inv_freq = max_timescale ** (-(2.0 * jnp.arange(half)) / d)  # [ceil(d/2)]
  angles = jnp.arange(length)[None].astype(jnp.float32)[..., None] * inv_freq.astype(jnp.float32)
  pairs = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [1, length, ceil(d/2), 2]
  return pairs.reshape(*angles.shape[:-1], 2 * half)[..., :d][0]


def _check_concrete_positions(positions: Array, rows: int, max_len: int, kind: str) -> None:
  """ValueError naming model.max_len if concrete positions reach past `rows` (traced ones clip)."""
  if not isinstance(positions, jax.core.Tracer):
    hi = int(np.max(np.asarray(positions), initial=0))
    if hi >= rows:
      raise ValueError(f"position {hi} >= model.max_len={max_len} ({kind} positions)")


@functools.lru_cache(maxsize=32)
def _sinusoidal_constant(length: int, d: int) -> np.ndarray:
  """sinusoidal_table(length, d) evaluated now (also inside a jit trace), as a NumPy array."""
  with jax.ensure_compile_time_eval():
    return np.asarray(sinusoidal_table(length, d))


def sinusoidal_lookup(positions: Array, max_len: int, d: int) -> Array:
  """[b, t] int positions -> [b, t, d]: rows of a constant table (cheaper than a sine each)."""
  rows = max(max_len, positions.shape[-1])
  _check_concrete_positions(positions, rows, max_len, "sinusoidal")
  return jnp.take(_sinusoidal_constant(rows, d), positions, axis=0, mode="clip")


def sincos_2d_table(height: int, width: int, d: int, temperature: float = 10000.0) -> np.ndarray:
  """big_vision's posemb_sincos_2d as [height * width, d] float32, the grid's rows row-major:
  d/4 columns each of sin(x w_i), cos(x w_i), sin(y w_i), cos(y w_i), x the column, y the row,
  w_i = temperature^(-i / (d/4 - 1))."""
  quarter = d // 4
  y, x = np.mgrid[:height, :width]
  omega = 1.0 / temperature ** (np.arange(quarter) / max(quarter - 1, 1))
  xs, ys = np.outer(x.ravel(), omega), np.outer(y.ravel(), omega)
  return np.concatenate([np.sin(xs), np.cos(xs), np.sin(ys), np.cos(ys)], 1).astype(np.float32)


def patch_grid(cfg: Any) -> int:
  """The patches along each side of an image (model.image_size // model.patch_size)."""
  return cfg.image_size // cfg.patch_size


def _sincos_2d(cfg, positions):
  """Rows of the patch grid's 2-D table; with a class token (position 0) a zero row first, as
  big_vision adds no position to it. Token inputs are a grid of one row of model.max_len."""
  grid = (patch_grid(cfg),) * 2 if cfg.image_size else (1, cfg.max_len)
  table = sincos_2d_table(*grid, cfg.d_model)
  if cfg.pooling == "class_token":
    table = np.concatenate([np.zeros((1, cfg.d_model), np.float32), table])
  _check_concrete_positions(positions, len(table), len(table), "sincos2d")
  return jnp.take(jnp.asarray(table), positions, axis=0, mode="clip")


class LearnedPositions(nn.Module):
  """A learned [max_len, features] table looked up by (checked, or clipped if traced) position."""
  max_len: int
  features: int
  param_dtype: Any = jnp.float32
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, positions: Array) -> Array:
    """[b, t] int positions -> [b, t, features]."""
    table = self.param("embedding", nn.with_logical_partitioning(
                           nn.initializers.normal(stddev=0.02), ("length", "embed")),
                       (self.max_len, self.features), self.param_dtype)
    _check_concrete_positions(positions, self.max_len, self.max_len, "learned")
    return jnp.take(jnp.asarray(table, self.dtype), positions, axis=0, mode="clip")


def rope_frequencies(h: int, base: float, scaling: str = "none", factor: float = 8.0,
                     low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                     original_max_len: int = 8192) -> np.ndarray:
  """RoPE's [h/2] float32 inverse frequencies base^(-2i/h), scaled: 'linear' divides each by
  `factor`; 'llama3' (Llama 3.1) divides those of wavelength > original_max_len / low_freq_factor,
  keeps those < original_max_len / high_freq_factor and interpolates smoothly between."""
  inv_freq = 1.0 / base ** (np.arange(0, h, 2, dtype=np.float64) / h)
  if scaling == "linear":
    inv_freq = inv_freq / factor
  elif scaling == "llama3":
    wavelength = 2 * np.pi / inv_freq
    smooth = (original_max_len / wavelength - low_freq_factor) / (high_freq_factor
                                                                  - low_freq_factor)
    interpolated = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    inv_freq = np.where(wavelength > original_max_len / low_freq_factor, inv_freq / factor,
                        np.where(wavelength < original_max_len / high_freq_factor, inv_freq,
                                 interpolated))
  elif scaling != "none":
    raise ValueError(f"model.rope_scaling={scaling!r} is not one of none|linear|llama3")
  return inv_freq.astype(np.float32)


def config_rope_frequencies(cfg: Any) -> Optional[np.ndarray]:
  """A ModelConfig's scaled RoPE frequencies; None without scaling (apply_rope's own)."""
  if cfg.rope_scaling == "none":
    return None
  return rope_frequencies(cfg.head_dim, cfg.rope_base, cfg.rope_scaling, cfg.rope_scaling_factor,
                          cfg.rope_low_freq_factor, cfg.rope_high_freq_factor,
                          cfg.rope_original_max_len)


def apply_rope(x: Array, positions: Array, base: float = 10000.0,
               inv_freq: Optional[np.ndarray] = None) -> Array:
  """RoPE ("rotate half", as GPT-NeoX/LLaMA) of [b, t, n, h] queries or keys by [b, t] positions;
  `inv_freq` [h/2] replaces base^(-2i/h) (e.g. `rope_frequencies`' scaled ones)."""
  h = x.shape[-1]
  if h % 2:
    raise ValueError(f"RoPE needs an even head dimension, got head_dim={h}")
  half = h // 2
  if inv_freq is None:
    inv_freq = base ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / h)  # [h/2]
  angles = positions.astype(jnp.float32)[:, :, None, None] * inv_freq  # [b, t, 1, h/2]
  sin, cos = jnp.sin(angles), jnp.cos(angles)
  x1 = x[..., :half].astype(jnp.float32)
  x2 = x[..., half:].astype(jnp.float32)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def max_distance_bound(num_buckets: int, bidirectional: bool) -> int:
  """max_exact, the offsets with their own bucket: max_distance must exceed it (and it be >= 1)."""
  return (num_buckets // 2 if bidirectional else num_buckets) // 2


def relative_position_bucket(relative_position: Array, bidirectional: bool = True,
                             num_buckets: int = 32, max_distance: int = 128) -> Array:
  """T5's int32 bucket in [0, num_buckets) of key_pos - query_pos: (per direction if bidirectional)
  exact for small offsets, then log-spaced up to max_distance; causal: future keys -> 0."""
  exact = max_distance_bound(num_buckets, bidirectional)
  if exact < 1:
    raise ValueError(f"relative position buckets: num_buckets={num_buckets} must be >= "
                     f"{4 if bidirectional else 2}")
  if max_distance <= exact:
    raise ValueError(f"relative position buckets: max_distance={max_distance} must be > {exact}, "
                     f"the offsets with exact buckets")
  relative_position = jnp.asarray(relative_position, jnp.int32)
  distance = -relative_position  # > 0 for keys in the past
  bucket = jnp.zeros_like(relative_position)
  if bidirectional:
    num_buckets //= 2
    bucket = bucket + jnp.where(distance < 0, num_buckets, 0)
    distance = jnp.abs(distance)
  else:
    distance = jnp.maximum(distance, 0)
  max_exact = num_buckets // 2
  # maximum(., 1) keeps the log finite on the unused branch.
  log_ratio = (jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact)
               / np.log(max_distance / max_exact))
  large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(jnp.int32)
  large = jnp.minimum(large, num_buckets - 1)
  return bucket + jnp.where(distance < max_exact, distance, large)


class RelativePositionBias(nn.Module):
  """T5's learned scalar bias per (relative-position bucket, head): [b, n, t, s] float32."""
  num_buckets: int
  max_distance: int
  num_heads: int
  bidirectional: bool = True
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, q_positions: Array, k_positions: Array) -> Array:
    """q_positions [b, t], k_positions [b, s] -> bias [b, n, t, s]."""
    table = self.param("rel_embedding", nn.with_logical_partitioning(
                           nn.initializers.normal(stddev=0.02), ("relpos_buckets", "heads")),
                       (self.num_buckets, self.num_heads), self.param_dtype)
    rel = k_positions[:, None, :] - q_positions[:, :, None]  # [b, t, s]
    buckets = relative_position_bucket(rel, self.bidirectional, self.num_buckets, self.max_distance)
    values = jnp.take(jnp.asarray(table, jnp.float32), buckets, axis=0)  # [b, t, s, n]
    return jnp.transpose(values, (0, 3, 1, 2))


def alibi_slopes(num_heads: int) -> np.ndarray:
  """ALiBi's head slopes [n] float32: 2^(-8i/n) for i = 1..n when n is a power of two; else
  those of the closest smaller power of two p, then every other slope of the 2p sequence."""
  if num_heads < 1:
    raise ValueError(f"alibi_slopes needs num_heads >= 1, got {num_heads}")
  p = 2 ** int(np.floor(np.log2(num_heads)))
  slopes = [2.0 ** (-8.0 * i / p) for i in range(1, p + 1)]
  if p < num_heads:
    slopes += [2.0 ** (-8.0 * i / (2 * p)) for i in range(1, 2 * p + 1, 2)][:num_heads - p]
  return np.asarray(slopes, np.float32)


def alibi_bias(q_positions: Array, k_positions: Array, slopes: Any) -> Array:
  """-slope * |q_pos - k_pos| as [b, n, t, s] float32 (symmetric: encoder or under a causal mask)."""
  dist = jnp.abs(q_positions[:, :, None] - k_positions[:, None, :]).astype(jnp.float32)  # [b, t, s]
  slopes = jnp.asarray(slopes, jnp.float32)
  return -slopes[None, :, None, None] * dist[:, None]


@dataclasses.dataclass(frozen=True)
class Encoding:
  """A config's encoding: its kind (choices.POSITIONALS) and its function (ENCODINGS; 'none': None)."""
  kind: str
  fn: Optional[Callable[..., Array]] = None


def _learned(cfg, positions):
  return LearnedPositions(cfg.max_len, cfg.d_model, param_dtype=jnp.dtype(cfg.param_dtype),
                          dtype=jnp.dtype(cfg.dtype), name="position_embed")(positions)


def _relative(cfg, q_positions, k_positions, bidirectional):
  return RelativePositionBias(cfg.relative_num_buckets, cfg.relative_max_distance, cfg.num_heads,
                              bidirectional=bidirectional, param_dtype=jnp.dtype(cfg.param_dtype),
                              name="relative_bias")(q_positions, k_positions)


def _shaw(cfg, q_positions, k_positions, bidirectional):
  """Shaw et al. 2018 as T5 simplified it: a learned scalar per head for each relative distance
  k_pos - q_pos clipped to [-K, K] (K = model.relative_max_distance), added as a bias."""
  del bidirectional  # both directions have their own entries; a causal mask hides the future
  clip = cfg.relative_max_distance
  table = nn.Embed(2 * clip + 1, cfg.num_heads, param_dtype=jnp.dtype(cfg.param_dtype),
                   embedding_init=nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02),
                                                               ("relpos_buckets", "heads")),
                   name="relative_bias")
  distance = jnp.clip(k_positions[:, None, :] - q_positions[:, :, None], -clip, clip)  # [b, t, s]
  return jnp.transpose(table(distance + clip).astype(jnp.float32), (0, 3, 1, 2))


ENCODINGS: keyspec.Table[Optional[Callable[..., Array]]] = keyspec.Table("model.positional", {
    "sinusoidal": lambda cfg, pos: sinusoidal_lookup(pos, cfg.max_len, cfg.d_model),
    "learned": _learned,
    "rope": lambda cfg, x, pos: apply_rope(x, pos, cfg.rope_base, config_rope_frequencies(cfg)),
    "relative": _relative,
    "alibi": lambda cfg, q_pos, k_pos, bidirectional: alibi_bias(q_pos, k_pos,
                                                                 alibi_slopes(cfg.num_heads)),
    "none": None,
    "shaw": _shaw,
    "sincos2d": _sincos_2d,
})


def encoding(cfg: Any) -> Encoding:
  """The kind and function of a (validated) ModelConfig's `positional`."""
  return Encoding(choices.POSITIONALS[cfg.positional].kind, ENCODINGS[cfg.positional])


class AbsoluteEncoding(nn.Module):
  """An 'absolute' entry of the table: [b, t] positions -> [b, t, d] for the token embeddings."""
  config: Any

  @nn.compact
  def __call__(self, positions: Array) -> Array:
    return encoding(self.config).fn(self.config, positions)


class BiasEncoding(nn.Module):
  """A 'bias' entry of the table: q [b, t] and k [b, s] positions -> [b, n, t, s] float32."""
  config: Any
  bidirectional: bool

  @nn.compact
  def __call__(self, q_positions: Array, k_positions: Array) -> Array:
    return encoding(self.config).fn(self.config, q_positions, k_positions, self.bidirectional)
