"""Model tests: numerics (bfloat16 compute with float32 logits, dropout only in training) and
the segment-aware right shift of the decoder inputs."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.models import shift_right

from model_fixtures import ARCHS, B, SV, TOL, V, _cfg, _forward, _init


@pytest.mark.parametrize('arch', ARCHS)
def test_bfloat16_compute_gives_float32_logits_close_to_float32(arch):
  """dtype=bfloat16 (float32 params) returns float32 logits within bfloat16 rounding of the
  float32 model's logits."""
  cfg = _cfg(arch=arch, positional='rope', norm_position='pre', ffn='swiglu', norm='rmsnorm')
  _, params = _init(cfg)
  rng = np.random.default_rng(9)
  inputs, targets = rng.integers(1, SV, size=(B, 8)), rng.integers(1, V, size=(B, 8))
  full = np.asarray(_forward(cfg, params, inputs, targets))
  half = _forward(dataclasses.replace(cfg, dtype='bfloat16'), params, inputs, targets)
  assert half.dtype == jnp.float32
  err = np.abs(np.asarray(half) - full).max() / full.std()
  assert 1e-4 < err < 0.1, err  # really computed in bfloat16, and close


def test_dropout_only_in_training():
  """deterministic=True ignores every dropout rate; deterministic=False with dropout changes
  the logits and is reproducible for the same rng."""
  cfg = _cfg(arch='encoder_decoder', positional='sinusoidal')
  _, params = _init(cfg)
  noisy = dataclasses.replace(cfg, dropout_rate=0.3, attention_dropout_rate=0.3,
                              ffn_dropout_rate=0.3)
  rng = np.random.default_rng(10)
  inputs, targets = rng.integers(1, SV, size=(B, 8)), rng.integers(1, V, size=(B, 8))
  clean = _forward(dataclasses.replace(cfg, dropout_rate=0.0), params, inputs, targets)
  np.testing.assert_allclose(_forward(noisy, params, inputs, targets), clean, **TOL)
  train = lambda key: _forward(noisy, params, inputs, targets, deterministic=False,
                               rngs={'dropout': jax.random.key(key)})
  assert not np.allclose(train(0), clean, atol=1e-3)
  np.testing.assert_array_equal(train(0), train(0))
  assert not np.allclose(train(0), train(1), atol=1e-3)


def test_shift_right_is_segment_aware():
  """Targets shift right by one with 0 (the start token) at the start of every packed segment."""
  targets = jnp.asarray([[5, 6, 7, 8, 9, 0]])
  seg = jnp.asarray([[1, 1, 2, 2, 2, 0]])
  np.testing.assert_array_equal(shift_right(targets, seg), [[0, 5, 0, 7, 8, 0]])
  np.testing.assert_array_equal(shift_right(targets), [[0, 5, 6, 7, 8, 9]])
