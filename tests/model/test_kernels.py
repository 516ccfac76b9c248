"""transformer/model/kernels.py: each backend's speed paths compute what Flax's own layers compute
(values and autodiff gradients), model.kernels picks them, and the model builder injects them."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config import ConfigError, model_config
from transformer.model import attention, kernels, layers, models

RNG = np.random.default_rng(0)


def _grads(fn, r, *args):
  return jax.grad(lambda *a: jnp.sum(fn(*a) * r), argnums=tuple(range(len(args))))(*args)


@pytest.mark.parametrize("name", sorted(kernels.BACKENDS))
@pytest.mark.parametrize("in_shape,out_shape", [((8,), (3, 2, 4)), ((2, 4), (8,))])
def test_project_equals_flax_dense_general(name, in_shape, out_shape):
  """project as nn.DenseGeneral's dot_general: the values and gradients (input, kernel, bias) of
  nn.DenseGeneral without it, on the same parameters."""
  x = jnp.asarray(RNG.normal(size=(2, 3, *in_shape)), jnp.float32)
  axes = tuple(f"a{i}" for i in range(len(in_shape) + len(out_shape)))
  make = functools.partial(attention.projection, in_shape=in_shape, features=out_shape, axes=axes,
                           use_bias=True, dtype=jnp.float32, param_dtype=jnp.float32, name=None)
  ours, plain = make(kernels=kernels.BACKENDS[name]), make(kernels=kernels.PLAIN)
  params = nn.meta.unbox(plain.init(jax.random.key(0), x))
  params = jax.tree.map(lambda a: a + 0.1, params)
  apply = lambda module: (lambda p, x: module.apply(p, x))
  np.testing.assert_allclose(apply(ours)(params, x), apply(plain)(params, x), rtol=1e-5,
                             atol=1e-5)
  r = jnp.asarray(RNG.normal(size=(2, 3, *out_shape)), jnp.float32)
  for got, want in zip(jax.tree.leaves(_grads(apply(ours), r, params, x)),
                       jax.tree.leaves(_grads(apply(plain), r, params, x))):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(kernels.BACKENDS))
def test_project_leaves_other_contractions_to_lax(name):
  """A contraction that is not x [b, t, *in] . kernel [*in, *out] is lax.dot_general's own."""
  x = jnp.asarray(RNG.normal(size=(4, 3, 5)), jnp.float32)
  kernel = jnp.asarray(RNG.normal(size=(4, 6)), jnp.float32)
  dims = (((0,), (0,)), ((), ()))
  np.testing.assert_array_equal(
      kernels.BACKENDS[name].project(x, kernel, dims, out_axes=(None,)),
      jax.lax.dot_general(x, kernel, dims))


@pytest.mark.parametrize("name", sorted(kernels.BACKENDS))
def test_layer_norm_equals_flax_layer_norm(name):
  """layer_norm: nn.LayerNorm's forward bit for bit, gradients (x, scale, bias) as autodiff's."""
  x = jnp.asarray(RNG.normal(size=(2, 3, 16)) * 3 + 1, jnp.float32)
  params = {"params": {"scale": jnp.asarray(RNG.normal(size=16) + 1, jnp.float32),
                       "bias": jnp.asarray(RNG.normal(size=16), jnp.float32)}}
  ours = lambda p, x: layers.KernelLayerNorm(kernels.BACKENDS[name].layer_norm).apply(p, x)
  plain = lambda p, x: nn.LayerNorm(epsilon=1e-6).apply(p, x)
  np.testing.assert_array_equal(ours(params, x), plain(params, x))
  r = jnp.asarray(RNG.normal(size=x.shape), jnp.float32)
  for got, want in zip(jax.tree.leaves(_grads(ours, r, params, x)),
                       jax.tree.leaves(_grads(plain, r, params, x))):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_select_picks_the_running_backend_for_auto():
  """'auto' is the running backend's entry (the CPU's on a CPU, PLAIN where BACKENDS has none),
  'plain' and 'cpu' their own, and an unknown name is model.kernels' one-line error."""
  backend = jax.default_backend()
  assert kernels.select("auto") is kernels.BACKENDS.get(backend, kernels.PLAIN)
  assert kernels.select("plain") is kernels.PLAIN and kernels.PLAIN == kernels.Kernels()
  assert kernels.select("cpu") is kernels.BACKENDS["cpu"]
  with pytest.raises(ConfigError, match=r"model\.kernels"):
    kernels.select("tpu_v9")


@pytest.mark.parametrize("name", ["plain", "cpu"])
def test_build_model_injects_the_configured_kernels(name):
  """build_model sets model.kernels' entry as the model's `kernels` field; under 'plain' every
  projection and norm is Flax's own layer (nn.DenseGeneral's default dot_general, nn.LayerNorm),
  under 'cpu' the projections carry its project and the norms are KernelLayerNorm."""
  cfg = model_config(arch="decoder_only", vocab_size=11, d_model=16, num_heads=2, mlp_dim=32,
                    num_decoder_layers=1, norm_position="pre", kernels=name)
  model = models.build_model(cfg)
  assert model.kernels is kernels.select(name)
  tokens = jnp.ones((1, 4), jnp.int32)
  seen = []

  def record(next_fun, args, kwargs, context):
    seen.append(context.module)
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    model.init(jax.random.key(0), tokens)
  norms = {type(m) for m in seen if "norm" in (m.name or "")}
  dense = [m for m in seen if isinstance(m, nn.DenseGeneral)]
  assert dense and norms
  if name == "plain":
    assert norms == {nn.LayerNorm} and all(m.dot_general is None for m in dense)
  else:
    assert norms == {layers.KernelLayerNorm}
    assert all(m.dot_general.func is kernels.BACKENDS["cpu"].project for m in dense)
