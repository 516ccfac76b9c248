"""Tests for layers.dropout / layers.Dropout: the 8-bit masks against a NumPy reference built from
the same threefry words, their statistics, and the 32-bit path against Flax's nn.Dropout."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from transformer.config import ConfigError, from_configdict
from transformer.model import layers


@pytest.mark.parametrize("shape", [(3, 7, 5), (3, 2, 8)])
def test_eight_bit_masks_are_the_bytes_of_threefry_words(shape):
  """bits=8: element i is dropped iff byte i (little-end first) of the uint32 words that
  jax.random.bits draws is below round(256 * rate), and kept elements are scaled by
  256 / (256 - threshold). Checked exactly against NumPy's byte view of the same words: for a last
  axis divisible by 4 the words have x's shape with that axis divided by 4 (so XLA can fuse the
  draw into the mask's consumer), else they cover x flattened and the last word's spare bytes are
  unused."""
  rate = 0.3
  x = jax.random.normal(jax.random.key(1), shape)
  rng = jax.random.key(7)
  got = np.asarray(layers.dropout(x, rate, rng, bits=8))
  n = x.size
  words_shape = (*shape[:-1], shape[-1] // 4) if shape[-1] % 4 == 0 else (-(-n // 4),)
  words = np.asarray(jax.random.bits(rng, words_shape, jnp.uint32)).astype("<u4")
  draws = words.reshape(-1).view(np.uint8)[:n].reshape(shape)
  threshold = round(256 * rate)  # 77
  want = np.where(draws >= threshold, np.asarray(x) * np.float32(256 / (256 - threshold)), 0.0)
  np.testing.assert_array_equal(got, want.astype(np.float32))
  assert 0 < (got == 0).sum() < n


def test_eight_bit_masks_drop_at_the_rounded_rate_independently_and_keep_the_mean():
  """Over 2M elements at rate 0.1: the dropped share is 26/256 within 5 standard deviations,
  neighbours (bytes of one word) are dropped independently (P(both) = p^2 within 5 sd), and the
  mean of the output equals the mean of the input (the scale makes the expectation exact)."""
  n, p = 2_000_000, 26 / 256
  x = jnp.ones((n,), jnp.float32)
  dropped = np.asarray(layers.dropout(x, 0.1, jax.random.key(3), bits=8)) == 0
  assert abs(dropped.mean() - p) < 5 * np.sqrt(p * (1 - p) / n)
  both = (dropped[0::2] & dropped[1::2]).mean()
  assert abs(both - p * p) < 5 * np.sqrt(p * p * (1 - p * p) / (n // 2))
  out = np.asarray(layers.dropout(x, 0.1, jax.random.key(4), bits=8), np.float64)
  assert abs(out.mean() - 1.0) < 5 * np.sqrt(p / (1 - p) / n)


def test_different_keys_give_different_masks_and_edge_rates():
  """Two keys give different masks; rate 0 keeps x; rate 1 (and 8-bit rates that round to 256)
  zero it; deterministic=True and rate 0 leave x untouched in the module."""
  x = jnp.ones((64, 64))
  a = layers.dropout(x, 0.5, jax.random.key(0), bits=8)
  b = layers.dropout(x, 0.5, jax.random.key(1), bits=8)
  assert not np.array_equal(np.asarray(a), np.asarray(b))
  for bits in (8, 32):
    np.testing.assert_array_equal(np.asarray(layers.dropout(x, 0.0, jax.random.key(0), bits)), x)
    assert not np.asarray(layers.dropout(x, 1.0, jax.random.key(0), bits)).any()
  assert not np.asarray(layers.dropout(x, 0.999, jax.random.key(0), bits=8)).any()
  module = layers.Dropout(0.5, 8)
  np.testing.assert_array_equal(module.apply({}, x, deterministic=True), x)
  np.testing.assert_array_equal(layers.Dropout(0.0).apply({}, x, deterministic=False), x)


def test_thirty_two_bits_is_flax_dropout_bit_for_bit_at_the_same_module_paths():
  """A module calling layers.Dropout(rate, 32) twice gives exactly what the same module with
  nn.Dropout(rate) gives on the same 'dropout' rng: same values and, through the auto-names
  Dropout_0 / Dropout_1, the same per-site keys: dropout_bits=32 gives nn.Dropout's masks."""

  class Ours(nn.Module):
    @nn.compact
    def __call__(self, x):
      return layers.Dropout(0.3, 32)(x, False) + 2 * layers.Dropout(0.3, 32)(x, False)

  class Flax(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dropout(0.3)(x, False) + 2 * nn.Dropout(0.3)(x, False)

  x = jax.random.normal(jax.random.key(0), (4, 9, 16))
  rngs = {"dropout": jax.random.key(5)}
  np.testing.assert_array_equal(Ours().apply({}, x, rngs=rngs), Flax().apply({}, x, rngs=rngs))


def test_dropout_bits_is_a_checked_config_key():
  """model.dropout_bits accepts 8 | 32 and names itself otherwise; the default is 32 (Flax's)."""
  cd = base.get_config()
  cd.model.dropout_bits = 16
  with pytest.raises(ConfigError, match=r"model\.dropout_bits=16 is not one of 8\|32"):
    from_configdict(cd)
  assert from_configdict(base.get_config()).model.dropout_bits == 32


def test_make_dropout_is_flax_dropout_unless_a_speed_option_or_a_traced_rate():
  """32 bits and a Python-number rate: nn.Dropout itself; 8 bits: the byte masks; an array rate
  (vmapped members), which nn.Dropout cannot take: layers.Dropout at the same bits."""
  assert type(layers.make_dropout(0.1, 32)) is nn.Dropout
  assert type(layers.make_dropout(0.1, 8)) is layers.Dropout
  traced = layers.make_dropout(jnp.asarray(0.1), 32)
  assert type(traced) is layers.Dropout and traced.bits == 32
