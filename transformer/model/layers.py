"""Building blocks: token embedding (with tied output logits), dropout, feed-forward, norms.
Parameters carry logical axis names ('vocab', 'embed', 'mlp', 'norm') for sharding. The layers are
Flax's (nn.Dense, nn.LayerNorm, nn.RMSNorm, nn.Dropout); a backend's speed paths come in as a
`kernels` field set when the model is built (transformer/model/kernels.py)."""

import dataclasses
import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import choices, keyspec
from transformer.config import ModelConfig
from transformer.model import parametrization
from transformer.model.kernels import PLAIN, Kernels

Array = jax.Array


def scaled_lecun_normal(scale: float = 1.0, **axes) -> Callable:
  """lecun_normal (std 1/sqrt(fan_in)) with its std times `scale` (1: lecun_normal itself)."""
  if scale == 1.0:
    return nn.initializers.lecun_normal(**axes)
  return nn.initializers.variance_scaling(scale**2, "fan_in", "truncated_normal", **axes)


def dense(features: int, axes: tuple[str, str], cfg: ModelConfig, name: str,
           dot_general=None, init_scale: float = 1.0) -> nn.Dense:
  """A Dense layer whose kernel (lecun_normal, std times `init_scale`) and bias carry logical
  axis names."""
  return nn.Dense(
      features, use_bias=cfg.use_bias, dtype=jnp.dtype(cfg.dtype), dot_general=dot_general,
      param_dtype=jnp.dtype(cfg.param_dtype),
      kernel_init=nn.with_logical_partitioning(scaled_lecun_normal(init_scale), axes),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (axes[1],)),
      name=name)


class Embed(nn.Module):
  """Token embedding [vocab, d_model], stddev d_model**-0.5 (µP: the base width's); `attend`:
  logits against it (tying)."""
  config: ModelConfig
  num_embeddings: int

  def setup(self):
    cfg = self.config
    init = nn.initializers.normal(stddev=parametrization.embedding_std(cfg))
    self.embedding = self.param("embedding", nn.with_logical_partitioning(init, ("vocab", "embed")),
                                (self.num_embeddings, cfg.d_model), jnp.dtype(cfg.param_dtype))

  def __call__(self, tokens: Array) -> Array:
    """[b, t] int -> [b, t, d] in the compute dtype."""
    cfg = self.config
    x = jnp.take(jnp.asarray(self.embedding, jnp.dtype(cfg.dtype)), tokens, axis=0)
    if cfg.scale_embeddings:  # sqrt(d_model); µP: sqrt(base width), fixed as the width grows
      x = x * jnp.asarray(parametrization.constants_width(cfg)**0.5, x.dtype)
    return x

  def attend(self, x: Array) -> Array:
    """[b, t, d] -> float32 logits [b, t, vocab] (bfloat16 can collapse training, flax #677)."""
    table = jnp.asarray(self.embedding, jnp.float32)
    return jnp.einsum("btd,vd->btv", x.astype(jnp.float32), table)


def _gelu_erf(x: Array) -> Array:
  """The exact GELU, as PyTorch's 'gelu' (nn.gelu's erfc form costs XLA:CPU much more)."""
  return x * 0.5 * (1.0 + jax.lax.erf(x * (0.5**0.5)))


# 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): GPT-2's "gelu_new", and cheaper than erf.
_gelu_tanh = functools.partial(nn.gelu, approximate=True)


# The activations the dense feed-forward variants name (choices.DENSE_FFNS: swiglu's is silu, ...).
ACTIVATIONS: keyspec.Table[Callable[[Array], Array]] = keyspec.Table("activation", {
    "relu": nn.relu,
    "gelu": _gelu_erf,
    "gelu_tanh": _gelu_tanh,
    "silu": nn.silu,
    "squared_relu": lambda x: jnp.square(nn.relu(x)),  # Primer (So et al. 2021)
})


@dataclasses.dataclass(frozen=True)
class FFN:
  """A dense feed-forward variant's maths: W2 act(W1 x), or gated W2 (act(Wg x) * Wu x)."""
  activation: Callable[[Array], Array]
  gated: bool = False


# The dense feed-forward variants (model.moe_expert_ffn): name -> the maths of its facts.
FFNS: keyspec.Table[FFN] = keyspec.Table("model.moe_expert_ffn", {
    name: FFN(ACTIVATIONS[facts.activation], facts.gated)
    for name, facts in choices.DENSE_FFNS.items()})


def dense_ffn(config: ModelConfig) -> FFN:
  """The dense variant a config's feed-forward layers compute (a mixture's: its experts')."""
  return FFNS[config.moe_expert_ffn if choices.FFNS[config.ffn].mixture else config.ffn]


def dropout(x: Array, rate: float | Array, rng: Array, bits: int = 8) -> Array:
  """x with each element zeroed with probability `rate`, the rest scaled to keep the mean: bits=32
  is nn.Dropout bit for bit, bits=8 drops element i when random byte i < round(256 * rate). An
  array `rate` (vmapped members) draws the same bits and keeps the same elements."""
  if not is_static(rate):
    return _dropout_traced(x, rate, rng, bits)
  if rate >= 1.0:
    return jnp.zeros_like(x)
  if bits == 32:
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jax.lax.select(keep, x / (1.0 - rate), jnp.zeros_like(x))
  threshold = round(256 * rate)
  if threshold >= 256:  # a rate within 1/512 of 1 rounds to "drop everything"
    return jnp.zeros_like(x)
  scale = jnp.asarray(256 / (256 - threshold), x.dtype)
  return jax.lax.select(_byte_draws(x.shape, rng) >= threshold, x * scale, jnp.zeros_like(x))


def _byte_draws(shape: tuple[int, ...], rng: Array) -> Array:
  """uint8 draws of `shape`, from words of the last axis / 4 where it divides (XLA fuses those)."""
  if shape and shape[-1] % 4 == 0:
    words = jax.random.bits(rng, (*shape[:-1], shape[-1] // 4), jnp.uint32)
    return jax.lax.bitcast_convert_type(words, jnp.uint8).reshape(shape)
  n = math.prod(shape)
  words = jax.random.bits(rng, (-(-n // 4),), jnp.uint32)
  return jax.lax.bitcast_convert_type(words, jnp.uint8).reshape(-1)[:n].reshape(shape)


def is_static(rate: Any) -> bool:
  """True for a rate given as a Python number, False for an array (a vmapped member's)."""
  return isinstance(rate, (int, float))


def is_off(rate: Any) -> bool:
  """True when dropout at `rate` is skipped: a static rate of 0 (a traced 0 keeps x exactly)."""
  return is_static(rate) and rate <= 0.0


def _dropout_traced(x: Array, rate: Array, rng: Array, bits: int) -> Array:
  """`dropout` with an array rate: the static rate's draws and decisions."""
  rate = jnp.asarray(rate, jnp.float32)
  if bits == 32:
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jax.lax.select(keep, x / jnp.maximum(1.0 - rate, 1e-12).astype(x.dtype),
                          jnp.zeros_like(x))
  threshold = jnp.round(256.0 * rate)  # round half to even, as Python's round
  scale = (256.0 / jnp.maximum(256.0 - threshold, 1.0)).astype(x.dtype)
  keep = _byte_draws(x.shape, rng).astype(jnp.int32) >= threshold.astype(jnp.int32)
  return jax.lax.select(keep, x * scale, jnp.zeros_like(x))


class Dropout(nn.Module):
  """nn.Dropout's interface (and rng, by module path) over `dropout`: 8-bit masks (the speed option
  model.dropout_bits=8), or an array rate (vmapped members) that nn.Dropout cannot take."""
  rate: float  # or an array (vmapped members: `dropout` takes a traced rate)
  bits: int = 8

  @nn.compact
  def __call__(self, x: Array, deterministic: bool = True) -> Array:
    if deterministic or is_off(self.rate):
      return x
    return dropout(x, self.rate, self.make_rng("dropout"), self.bits)


def make_dropout(rate: float | Array, bits: int) -> nn.Module:
  """nn.Dropout(rate) for 32 bits (model.dropout_bits' default) and a Python-number rate, else
  `Dropout` (whose 32-bit masks are nn.Dropout's, bit for bit); both auto-name 'Dropout_i'."""
  if bits == 32 and is_static(rate):
    return nn.Dropout(rate)
  return Dropout(rate, bits)


class FeedForward(nn.Module):
  """Position-wise feed-forward dense_ffn(config), hidden size mlp_dim, ffn_dropout_rate on it."""
  config: ModelConfig
  kernels: Kernels = PLAIN

  @nn.compact
  def __call__(self, x: Array, deterministic: bool = True) -> Array:
    cfg = self.config
    ffn = dense_ffn(cfg)
    widen = functools.partial(dense, cfg.mlp_dim, ("embed", "mlp"), cfg,
                              dot_general=self.kernels.dense_dot_general)
    if ffn.gated:
      h = ffn.activation(widen("wi_gate")(x)) * widen("wi_up")(x)  # [b, t, f]
    else:
      h = ffn.activation(widen("wi")(x))  # [b, t, f]
    h = make_dropout(cfg.ffn_dropout_rate, cfg.dropout_bits)(h, deterministic=deterministic)
    return dense(cfg.d_model, ("mlp", "embed"), cfg, "wo")(h)


class KernelLayerNorm(nn.Module):
  """nn.LayerNorm's fields, parameters and values, computed by a backend's `layer_norm(x, scale,
  bias, epsilon)` (Kernels.layer_norm)."""
  layer_norm: Callable[[Array, Array, Array, float], Array]
  epsilon: float = 1e-6
  dtype: Any = None
  param_dtype: Any = jnp.float32
  scale_init: Callable = nn.initializers.ones_init()
  bias_init: Callable = nn.initializers.zeros_init()

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """[..., d] -> [..., d] in `dtype` (None: x's, where flax would promote with the params')."""
    d = x.shape[-1]
    scale = self.param("scale", self.scale_init, (d,), self.param_dtype)
    bias = self.param("bias", self.bias_init, (d,), self.param_dtype)
    y = self.layer_norm(x, jnp.asarray(scale), jnp.asarray(bias), self.epsilon)
    return y.astype(self.dtype or x.dtype)


# The norms (model.norm): name -> Flax's module.
NORMS: keyspec.Table[Callable[..., nn.Module]] = keyspec.Table(
    "model.norm", {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm})


def make_norm(config: ModelConfig, name: str | None = None, *,
              kernels: Kernels = PLAIN) -> nn.Module:
  """The norm NORMS[config.norm], epsilon `config.norm_eps`, parameters on axis 'norm';
  `kernels.layer_norm` computes a layernorm's values where the backend has one."""
  norm_axis = lambda init: nn.with_logical_partitioning(init, ("norm",))
  settings = dict(epsilon=config.norm_eps, dtype=jnp.dtype(config.dtype),
                  param_dtype=jnp.dtype(config.param_dtype),
                  scale_init=norm_axis(nn.initializers.ones_init()), name=name)
  if config.norm == "layernorm":
    settings["bias_init"] = norm_axis(nn.initializers.zeros_init())
    if kernels.layer_norm is not None:
      return KernelLayerNorm(layer_norm=kernels.layer_norm, **settings)
  return NORMS[config.norm](**settings)
