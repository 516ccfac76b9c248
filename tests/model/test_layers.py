"""Tests for transformer.model.layers against NumPy references built from the same parameters."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config import model_config
from transformer.model import kernels
from transformer.model.layers import Embed, FeedForward, FFNS, make_norm
from transformer.model.models import build_model


def _cfg(**overrides):
  base = dict(vocab_size=13, source_vocab_size=13, d_model=16, num_heads=2, mlp_dim=24,
              num_encoder_layers=1, num_decoder_layers=1)
  base.update(overrides)
  return model_config(**base)


@pytest.mark.parametrize("scale", [True, False])
def test_embed_lookup_and_tied_logits(scale):
  """Embed returns table rows (times sqrt(d_model) iff scale_embeddings) and attend = x @ E^T."""
  cfg = _cfg(scale_embeddings=scale)
  embed = Embed(cfg, 13)
  tokens = jnp.array([[1, 5, 0], [12, 3, 3]])
  variables = embed.init(jax.random.key(0), tokens)
  boxed = variables["params"]["embedding"]
  assert boxed.names == ("vocab", "embed")
  table = np.asarray(nn.meta.unbox(boxed))
  assert table.shape == (13, 16)
  out = embed.apply(variables, tokens)
  np.testing.assert_allclose(out, table[np.asarray(tokens)] * (4.0 if scale else 1.0), rtol=1e-6)
  x = np.random.default_rng(0).normal(size=(2, 3, 16)).astype(np.float32)
  logits = embed.apply(variables, jnp.asarray(x), method="attend")
  np.testing.assert_allclose(logits, x @ table.T, rtol=1e-5, atol=1e-5)


def _np_gelu(x):
  from math import erf, sqrt
  return x * 0.5 * (1 + np.vectorize(erf)(x / sqrt(2)))


_NP_ACTS = {
    "relu": lambda x: np.maximum(x, 0),
    "gelu": _np_gelu,
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    "swiglu": lambda x: x / (1 + np.exp(-x)),
    "geglu": _np_gelu,
    "geglu_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    "squared_relu": lambda x: np.maximum(x, 0)**2,  # Primer
}


def test_every_feedforward_variant_has_a_numpy_reference():
  """layers.FFNS, the config's model.ffn choices, and the references below are the same names."""
  assert set(FFNS) == set(_NP_ACTS)


@pytest.mark.parametrize("ffn", list(_NP_ACTS))
def test_feedforward_matches_numpy(ffn):
  """Each FFN variant equals W2 act(W1 x) (+ biases), gated variants W2 (act(Wg x) * Wu x)
  (geglu_tanh, T5 v1.1's "gated-gelu", with the tanh GELU); the hidden size is mlp_dim and
  kernels carry ('embed', 'mlp') / ('mlp', 'embed') axes."""
  cfg = _cfg(ffn=ffn)
  x = np.random.default_rng(1).normal(size=(2, 3, 16)).astype(np.float32)
  variables = FeedForward(cfg).init(jax.random.key(1), jnp.asarray(x))
  boxed = variables["params"]
  assert boxed["wo"]["kernel"].names == ("mlp", "embed")
  p = jax.tree.map(np.asarray, nn.meta.unbox(boxed))
  act = _NP_ACTS[ffn]
  dense = lambda name, y: y @ p[name]["kernel"] + p[name]["bias"]
  if FFNS[ffn].gated:
    assert p["wi_gate"]["kernel"].shape == (16, 24) and p["wi_up"]["kernel"].shape == (16, 24)
    hidden = act(dense("wi_gate", x)) * dense("wi_up", x)
  else:
    assert p["wi"]["kernel"].shape == (16, 24)
    hidden = act(dense("wi", x))
  want = dense("wo", hidden)
  got = FeedForward(cfg).apply(variables, jnp.asarray(x))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _np_gelu_grad(x):
  from math import erf, sqrt
  return 0.5 * (1 + np.vectorize(erf)(x / sqrt(2))) + x * np.exp(-x**2 / 2) / sqrt(2 * np.pi)


@pytest.mark.parametrize("ffn", ["relu", "gelu", "squared_relu"])
def test_feedforward_gradients_match_numpy(ffn):
  """The gradients of sum(r * FFN(x)) with respect to x and every kernel equal the NumPy chain
  rule: dh = (r W2^T) act'(x W1 + b1), dW1 = x^T dh over all tokens, dx = dh W1^T, dW2 = h^T r
  (the expanding projection's kernel gradient is hand-written in layers.py)."""
  cfg = _cfg(ffn=ffn)
  rng = np.random.default_rng(4)
  x = rng.normal(size=(2, 3, 16)).astype(np.float32)
  r = rng.normal(size=(2, 3, 16)).astype(np.float32)
  variables = FeedForward(cfg).init(jax.random.key(2), jnp.asarray(x))
  params = nn.meta.unbox(variables["params"])
  loss = lambda p, x: jnp.sum(FeedForward(cfg).apply({"params": p}, x) * r)
  g_params, g_x = jax.grad(loss, argnums=(0, 1))(params, jnp.asarray(x))
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  x64, r64 = x.astype(np.float64), r.astype(np.float64)
  pre = x64 @ p["wi"]["kernel"] + p["wi"]["bias"]
  act, act_grad = {"relu": (lambda z: np.maximum(z, 0), lambda z: (z > 0).astype(float)),
                   "gelu": (_np_gelu, _np_gelu_grad),
                   "squared_relu": (lambda z: np.maximum(z, 0)**2, lambda z: 2 * np.maximum(z, 0))}[ffn]
  dh = (r64 @ p["wo"]["kernel"].T) * act_grad(pre)
  tokens = lambda a: a.reshape(-1, a.shape[-1])
  np.testing.assert_allclose(g_params["wi"]["kernel"], tokens(x64).T @ tokens(dh),
                             rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(g_params["wi"]["bias"], tokens(dh).sum(0), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(g_params["wo"]["kernel"], tokens(act(pre)).T @ tokens(r64),
                             rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(g_x, dh @ p["wi"]["kernel"].T, rtol=1e-4, atol=1e-5)


def test_feedforward_dropout_only_when_not_deterministic():
  """ffn_dropout_rate drops hidden units in training mode only; without bias a dropped unit is 0."""
  cfg = _cfg(ffn_dropout_rate=0.5, use_bias=False, mlp_dim=8)  # d > f: hidden recoverable
  x = jnp.asarray(np.random.default_rng(2).normal(size=(1, 4, 16)), jnp.float32)
  variables = FeedForward(cfg).init(jax.random.key(0), x)
  det = FeedForward(cfg).apply(variables, x, deterministic=True)
  p = jax.tree.map(np.asarray, nn.meta.unbox(variables["params"]))
  np.testing.assert_allclose(det, np.maximum(np.asarray(x) @ p["wi"]["kernel"], 0)
                             @ p["wo"]["kernel"], rtol=1e-4, atol=1e-5)
  train = FeedForward(cfg).apply(variables, x, deterministic=False,
                                 rngs={"dropout": jax.random.key(3)})
  assert not np.allclose(det, train)
  # Recover the dropped hidden units: the output is W2 (mask * h / keep_prob).
  hidden = np.maximum(np.asarray(x) @ p["wi"]["kernel"], 0)
  coeffs = np.linalg.lstsq(p["wo"]["kernel"].T, np.asarray(train)[0].T, rcond=None)[0].T
  ratio = coeffs[hidden[0] > 1e-3] / hidden[0][hidden[0] > 1e-3]
  assert np.all(np.isclose(ratio, 0, atol=1e-3) | np.isclose(ratio, 2, atol=1e-3))


@pytest.mark.parametrize("kernels_name", ["plain", "cpu"])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_norms_match_formula(norm, kernels_name):
  """LayerNorm = (x - mean) / sqrt(var + eps), RMSNorm = x / sqrt(mean(x^2) + eps), eps from
  config.norm_eps, with Flax's norms and with the CPU kernels; the scale carries the 'norm' axis."""
  eps = 0.5  # large so that a wrong epsilon shows
  cfg = _cfg(norm=norm, norm_eps=eps)
  x = np.random.default_rng(3).normal(size=(2, 3, 16)).astype(np.float32) * 2 + 1
  module = make_norm(cfg, kernels=kernels.select(kernels_name))
  variables = module.init(jax.random.key(0), jnp.asarray(x))
  assert variables["params"]["scale"].names == ("norm",)
  got = module.apply(variables, jnp.asarray(x))
  if norm == "layernorm":
    centered = x - x.mean(-1, keepdims=True)
    want = centered / np.sqrt(centered.var(-1, keepdims=True) + eps)
  else:
    want = x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_layernorm_gradients_match_numpy_chain_rule():
  """The CPU kernels' hand-written LayerNorm backward (kernels._layer_norm_bwd) against the
  float64 NumPy chain rule of y = (x - mean) / sqrt(var + eps) * s + b: dx = rstd (g s - mean(g s)
  - xhat mean(g s xhat)), ds = sum(g xhat), db = sum(g); with a non-trivial scale and bias, and
  the forward equal to flax's nn.LayerNorm (same parameters, same values)."""
  eps = 1e-6
  cfg = _cfg(norm="layernorm", norm_eps=eps)
  rng = np.random.default_rng(5)
  x = (rng.normal(size=(2, 3, 16)) * 3 + 1).astype(np.float32)
  r = rng.normal(size=(2, 3, 16)).astype(np.float32)
  module = make_norm(cfg, kernels=kernels.BACKENDS["cpu"])
  params = {"scale": jnp.asarray(rng.normal(size=16) + 1, jnp.float32),
            "bias": jnp.asarray(rng.normal(size=16), jnp.float32)}
  y = module.apply({"params": params}, jnp.asarray(x))
  np.testing.assert_array_equal(y, nn.LayerNorm(epsilon=eps).apply({"params": params}, x))
  loss = lambda p, x: jnp.sum(module.apply({"params": p}, x) * r)
  g_params, g_x = jax.grad(loss, argnums=(0, 1))(params, jnp.asarray(x))
  x64, r64 = x.astype(np.float64), r.astype(np.float64)
  s64, b64 = (np.asarray(params[k], np.float64) for k in ("scale", "bias"))
  rstd = 1 / np.sqrt(x64.var(-1, keepdims=True) + eps)
  xhat = (x64 - x64.mean(-1, keepdims=True)) * rstd
  gs = r64 * s64
  dx = rstd * (gs - gs.mean(-1, keepdims=True) - xhat * (gs * xhat).mean(-1, keepdims=True))
  np.testing.assert_allclose(g_x, dx, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(g_params["scale"], (r64 * xhat).sum((0, 1)), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(g_params["bias"], r64.sum((0, 1)), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(y, xhat * s64 + b64, rtol=1e-4, atol=1e-5)
  # and equal to autodiff of flax's nn.LayerNorm (another implementation of the same function)
  flax_grads = jax.grad(lambda p, x: jnp.sum(nn.LayerNorm(epsilon=eps).apply({"params": p}, x) * r),
                        argnums=(0, 1))(params, jnp.asarray(x))
  for got, want in zip(jax.tree.leaves((g_params, g_x)), jax.tree.leaves(flax_grads)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_layernorm_in_bfloat16_keeps_float32_statistics_and_dtypes():
  """model.dtype=bfloat16 under the CPU kernels: the norm's output (and its input gradient) is
  bfloat16, the parameter gradients float32, both parameters carry the 'norm' axis, and the values
  and gradients are nn.LayerNorm's with the same dtypes (the input gradient to bfloat16's
  precision)."""
  cfg = _cfg(norm="layernorm", dtype="bfloat16")
  x = jnp.asarray(np.random.default_rng(6).normal(size=(2, 3, 16)) * 2 + 1, jnp.bfloat16)
  module = make_norm(cfg, kernels=kernels.BACKENDS["cpu"])
  variables = module.init(jax.random.key(0), x)
  y = module.apply(variables, x)
  ref = nn.LayerNorm(epsilon=cfg.norm_eps, dtype=jnp.bfloat16).apply(nn.meta.unbox(variables), x)
  assert y.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(ref, np.float32))
  g_params, g_x = jax.grad(lambda p, x: jnp.sum(module.apply(p, x).astype(jnp.float32)),
                           argnums=(0, 1))(variables, x)
  ref_params, ref_x = jax.grad(
      lambda p, x: jnp.sum(nn.LayerNorm(epsilon=cfg.norm_eps, dtype=jnp.bfloat16).apply(p, x)
                           .astype(jnp.float32)), argnums=(0, 1))(nn.meta.unbox(variables), x)
  assert g_x.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(g_x, np.float32), np.asarray(ref_x, np.float32), atol=0.02)
  g_params = nn.meta.unbox(g_params)["params"]
  for name in ("scale", "bias"):
    assert variables["params"][name].names == ("norm",)
    assert g_params[name].dtype == jnp.float32
    np.testing.assert_allclose(g_params[name], ref_params["params"][name], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tie", [True, False])
def test_bfloat16_model_computes_logits_in_float32(tie):
  """A bfloat16 model's logits (tied: Embed.attend; untied: the decoder's logits_dense) equal the
  float32 product of its bfloat16 final hidden states and the float32 output table, to float32
  precision (T5X's rule: a bfloat16 log-softmax can collapse training); the same product in
  bfloat16 is off by far more, so the check can tell them apart."""
  cfg = _cfg(arch="decoder_only", dtype="bfloat16", norm_position="pre", tie_embeddings=tie)
  model = build_model(cfg)
  tokens = jnp.asarray(np.random.default_rng(4).integers(1, 13, size=(2, 5)), jnp.int32)
  variables = model.init(jax.random.key(0), tokens)
  logits, state = model.apply(variables, tokens, mutable=["intermediates"],
                              capture_intermediates=lambda mdl, _: mdl.name == "final_norm")
  hidden = state["intermediates"]["decoder"]["final_norm"]["__call__"][0]  # [b, t, d]
  assert hidden.dtype == jnp.bfloat16 and logits.dtype == jnp.float32
  params = nn.meta.unbox(variables["params"])
  table = (params["token_embed"]["embedding"] if tie
           else params["decoder"]["logits_dense"]["kernel"].T)  # [v, d]
  want = np.einsum("btd,vd->btv", np.asarray(hidden, np.float32), np.asarray(table, np.float32))
  np.testing.assert_allclose(logits, want, rtol=1e-6, atol=1e-6)
  in_bf16 = jnp.einsum("btd,vd->btv", hidden, jnp.asarray(table, jnp.bfloat16))
  assert np.abs(np.asarray(in_bf16, np.float32) - want).max() > 1e-3


@pytest.mark.parametrize("tie", [True, False])
def test_scale_decoder_output_multiplies_the_logits_by_rsqrt_d_model(tie):
  """model.scale_decoder_output (the original T5) multiplies the decoder's output by
  d_model**-0.5 before the (tied or untied, bias-free, linear) head: with the same parameters the
  logits are exactly d_model**-0.5 times those without it."""
  cfg = _cfg(tie_embeddings=tie, norm_position="pre", norm="rmsnorm", use_bias=False)
  inputs, targets = jnp.array([[5, 6, 7, 1]]), jnp.array([[8, 9, 1]])
  model = build_model(cfg)
  params = model.init(jax.random.key(0), inputs, targets)["params"]
  plain = model.apply({"params": params}, inputs, targets)
  scaled = build_model(dataclasses.replace(cfg, scale_decoder_output=True)).apply(
      {"params": params}, inputs, targets)
  np.testing.assert_allclose(scaled, np.asarray(plain) * 16**-0.5, rtol=1e-5, atol=1e-6)
