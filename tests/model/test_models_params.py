"""Model tests: parameters (scan/remat layouts give the same numbers, the base model's count,
logical axis names, embedding sharing and tying) and build_model's checks."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config import ConfigError, model_config
from transformer.model.models import build_model

from model_fixtures import ARCHS, B, SV, V, _cfg, _forward, _init, _stack_layers, _unstack_layers


@pytest.mark.parametrize("arch", ARCHS)
def test_scan_and_remat_do_not_change_numbers(arch):
  """scan_layers on/off and remat none/full/dots/dots_no_batch give the same loss and the same
  gradients from the same parameters (converted between unrolled and stacked layouts); the
  scanned model's own init has exactly the stacked layout."""
  base = _cfg(arch=arch, positional="relative")
  _, params = _init(base)
  rng = np.random.default_rng(8)
  inputs = np.pad(rng.integers(1, SV, size=(B, 6)), ((0, 0), (0, 2)))
  targets = np.pad(rng.integers(1, V, size=(B, 7)), ((0, 0), (0, 1)))
  w = jnp.asarray(rng.normal(size=(B, 8, V)), jnp.float32)
  def loss(cfg, p):
    return jnp.sum(_forward(cfg, p, inputs, targets) * w)
  ref, ref_grad = jax.jit(jax.value_and_grad(functools.partial(loss, base)))(params)
  variants = [(True, "none"), (False, "full"), (True, "dots")]
  if arch == "decoder_only":  # the same stack code; one more policy, kept short for speed
    variants = [(True, "dots_no_batch")]
  for scan, remat in variants:
    cfg = dataclasses.replace(base, scan_layers=scan, remat=remat)
    p = _stack_layers(params) if scan else params
    args = (jnp.asarray(targets),)
    if arch == "encoder_decoder":
      args = (jnp.asarray(inputs),) + args
    own = jax.eval_shape(build_model(cfg).init, jax.random.key(0), *args)["params"]
    assert (jax.tree.map(lambda x: x.shape, nn.meta.unbox(own))
            == jax.tree.map(lambda x: x.shape, p))
    value, grad = jax.jit(jax.value_and_grad(functools.partial(loss, cfg)))(p)
    np.testing.assert_allclose(value, ref, rtol=1e-5)
    grad = _unstack_layers(grad) if scan else grad
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                 grad, ref_grad)


def test_remat_dots_recomputes_no_matmul():
  """remat='dots' saves every matmul's output, so the backward pass recomputes none: the traced
  gradient has as many dot_generals as without remat, and 'full' (which saves nothing) has more.
  kernels.matmul (the FFN's expanding projection and every attention projection) hides its dot in
  a custom_vjp, which the plain dot policy does not see; its outputs are saved by name."""
  base = _cfg(arch="encoder_decoder")
  _, params = _init(base)
  rng = np.random.default_rng(9)
  inputs = rng.integers(1, SV, size=(B, 8))
  targets = rng.integers(1, V, size=(B, 8))
  def dots(remat):
    cfg = dataclasses.replace(base, remat=remat)
    grad = jax.grad(lambda p: jnp.sum(_forward(cfg, p, inputs, targets)))
    return str(jax.make_jaxpr(grad)(params)).count("dot_general")
  none, with_dots, full = dots("none"), dots("dots"), dots("full")
  assert with_dots == none < full


def test_base_transformer_parameter_count():
  """The paper's base model (6+6 layers, d=512, 8 heads, d_ff=2048, one shared 37000-token table
  tied to the output, biases in every projection, LayerNorm scale+bias, sinusoidal positions)
  has exactly V*d + 6*(4(d^2+d) + 2*d*d_ff + d_ff + d + 2*2d)
  + 6*(8(d^2+d) + 2*d*d_ff + d_ff + d + 3*2d) = 63,082,496 parameters (shapes only)."""
  cfg = model_config(vocab_size=37000, source_vocab_size=37000)
  assert (cfg.num_encoder_layers, cfg.num_decoder_layers, cfg.d_model, cfg.num_heads,
          cfg.mlp_dim, cfg.tie_embeddings, cfg.share_src_tgt_embeddings) == (6, 6, 512, 8, 2048,
                                                                            True, True)
  v, d, f = 37000, 512, 2048
  enc = 4 * (d * d + d) + 2 * d * f + f + d + 2 * 2 * d
  dec = 8 * (d * d + d) + 2 * d * f + f + d + 3 * 2 * d
  want = v * d + 6 * enc + 6 * dec
  assert want == 63_082_496
  x = jnp.ones((1, 8), jnp.int32)
  shapes = jax.eval_shape(build_model(cfg).init, jax.random.key(0), x, x)["params"]
  assert sum(int(np.prod(l.shape)) for l in jax.tree.leaves(shapes)) == want


def test_parameters_carry_logical_axis_names():
  """Every parameter is boxed with one known logical axis name per dimension; under scan_layers
  the layers' parameters lead with 'layers'."""
  allowed = {"vocab", "embed", "mlp", "heads", "kv_heads", "head_dim", "layers", "relpos_buckets",
             "length", "norm", None}
  for positional in ("relative", "learned"):
    cfg = _cfg(positional=positional, scan_layers=True, tie_embeddings=False)
    x = jnp.ones((B, 8), jnp.int32)
    shapes = jax.eval_shape(build_model(cfg).init, jax.random.key(0), x, x)["params"]
    is_box = lambda leaf: isinstance(leaf, nn.LogicallyPartitioned)
    flat = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=is_box)[0]
    for path, leaf in flat:
      assert is_box(leaf), path
      assert len(leaf.names) == leaf.value.ndim and set(leaf.names) <= allowed, (path, leaf.names)
      if any(getattr(k, "key", None) == "layers" for k in path):
        assert leaf.names[0] == "layers", path


@pytest.mark.parametrize("share,tie", [(True, True), (True, False), (False, True), (False, False)])
def test_embedding_sharing_and_tying(share, tie):
  """share_src_tgt_embeddings: one table (the larger vocabulary) for both stacks, else a source
  [SV, d] and a target [V, d] table; tie_embeddings: logits from the target table, else a
  separate [d, V] projection. Logits are [b, t, V] float32 either way."""
  cfg = _cfg(share_src_tgt_embeddings=share, tie_embeddings=tie)
  model, x = build_model(cfg), jnp.ones((B, 8), jnp.int32)
  params = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), x, x)["params"])
  tables = {k: v["embedding"].shape for k, v in params.items() if k.endswith("embed")}
  if share:
    assert tables == {"token_embed": (max(V, SV), 32)}
  else:
    assert tables == {"source_embed": (SV, 32), "target_embed": (V, 32)}
  assert ("logits_dense" in params["decoder"]) == (not tie)
  if not tie:
    assert params["decoder"]["logits_dense"]["kernel"].shape == (32, V)
  logits = jax.eval_shape(model.apply, {"params": params}, x, x)
  assert logits.shape == (B, 8, V) and logits.dtype == jnp.float32


def test_build_model_requires_vocab_sizes():
  """build_model raises ConfigError naming the key when a vocabulary size is still 0."""
  with pytest.raises(ConfigError, match=r"model\.vocab_size=0"):
    build_model(_cfg(vocab_size=0))
  with pytest.raises(ConfigError, match=r"model\.source_vocab_size=0"):
    build_model(_cfg(source_vocab_size=0))
  assert build_model(_cfg(arch="decoder_only", source_vocab_size=0)) is not None
