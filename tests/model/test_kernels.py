"""transformer/model/kernels.py: each backend's speed paths compute what the plain ones compute
(values and autodiff gradients), and the table picks the CPU's on a CPU."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.model import kernels

RNG = np.random.default_rng(0)


def _grads(fn, r, *args):
  return jax.grad(lambda *a: jnp.sum(fn(*a) * r), argnums=tuple(range(len(args))))(*args)


@pytest.mark.parametrize("name", sorted(kernels.KERNELS))
@pytest.mark.parametrize("in_shape,out_shape", [((8,), (3, 2, 4)), ((2, 4), (8,))])
def test_project_equals_the_plain_contraction(name, in_shape, out_shape):
  """project: same values and gradients (input and kernel) as PLAIN's dot_general."""
  x = jnp.asarray(RNG.normal(size=(2, 3, *in_shape)), jnp.float32)
  kernel = jnp.asarray(RNG.normal(size=(*in_shape, *out_shape)), jnp.float32)
  axes = (None,) * len(out_shape)
  ours = lambda x, k: kernels.KERNELS[name].project(x, k, len(in_shape), axes)
  plain = lambda x, k: kernels.PLAIN.project(x, k, len(in_shape), axes)
  np.testing.assert_allclose(ours(x, kernel), plain(x, kernel), rtol=1e-5, atol=1e-5)
  r = jnp.asarray(RNG.normal(size=(2, 3, *out_shape)), jnp.float32)
  for got, want in zip(_grads(ours, r, x, kernel), _grads(plain, r, x, kernel)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(kernels.KERNELS))
def test_layer_norm_equals_the_plain_one(name):
  """layer_norm: the same forward bit for bit, gradients (x, scale, bias) as autodiff's."""
  x = jnp.asarray(RNG.normal(size=(2, 3, 16)) * 3 + 1, jnp.float32)
  scale = jnp.asarray(RNG.normal(size=16) + 1, jnp.float32)
  bias = jnp.asarray(RNG.normal(size=16), jnp.float32)
  ours = lambda *a: kernels.KERNELS[name].layer_norm(*a, 1e-6)
  plain = lambda *a: kernels.PLAIN.layer_norm(*a, 1e-6)
  np.testing.assert_array_equal(ours(x, scale, bias), plain(x, scale, bias))
  r = jnp.asarray(RNG.normal(size=x.shape), jnp.float32)
  for got, want in zip(_grads(ours, r, x, scale, bias), _grads(plain, r, x, scale, bias)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_the_table_picks_the_cpu_kernels_on_a_cpu():
  """current() is KERNELS[backend], PLAIN for a backend the table lacks."""
  assert jax.default_backend() != "cpu" or kernels.current() is kernels.KERNELS["cpu"]
  assert kernels.KERNELS.get("no such backend", kernels.PLAIN) is kernels.PLAIN


def test_use_forces_an_entry_in_its_block_and_thread_only():
  """use('plain') makes current() PLAIN inside the block, in this thread only; unknown names fail."""
  before = kernels.current()
  seen = []
  with kernels.use("plain"):
    assert kernels.current() is kernels.PLAIN
    thread = threading.Thread(target=lambda: seen.append(kernels.current()))
    thread.start()
    thread.join()
  assert kernels.current() is before and seen == [before]
  with pytest.raises(ValueError, match="no_such"):
    with kernels.use("no_such"):
      pass
