"""Model tests: numerics (bfloat16 compute with float32 logits, dropout only in training) and
the segment-aware right shift of the decoder inputs."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.model.models import shift_right

from model_fixtures import ARCHS, B, SV, TOL, V, _cfg, _forward, _init


@pytest.mark.parametrize("arch", ARCHS)
def test_bfloat16_compute_gives_float32_logits_close_to_float32(arch):
  """dtype=bfloat16 (float32 params) returns float32 logits within bfloat16 rounding of the
  float32 model's logits."""
  cfg = _cfg(arch=arch, positional="rope", norm_position="pre", ffn="swiglu", norm="rmsnorm")
  _, params = _init(cfg)
  rng = np.random.default_rng(9)
  inputs, targets = rng.integers(1, SV, size=(B, 8)), rng.integers(1, V, size=(B, 8))
  full = np.asarray(_forward(cfg, params, inputs, targets))
  half = _forward(dataclasses.replace(cfg, dtype="bfloat16"), params, inputs, targets)
  assert half.dtype == jnp.float32
  err = np.abs(np.asarray(half) - full).max() / full.std()
  assert 1e-4 < err < 0.1, err  # really computed in bfloat16, and close


def test_dropout_only_in_training():
  """deterministic=True ignores every dropout rate; deterministic=False with dropout changes
  the logits and is reproducible for the same rng."""
  cfg = _cfg(arch="encoder_decoder", positional="sinusoidal")
  _, params = _init(cfg)
  noisy = dataclasses.replace(cfg, dropout_rate=0.3, attention_dropout_rate=0.3,
                              ffn_dropout_rate=0.3)
  rng = np.random.default_rng(10)
  inputs, targets = rng.integers(1, SV, size=(B, 8)), rng.integers(1, V, size=(B, 8))
  clean = _forward(dataclasses.replace(cfg, dropout_rate=0.0), params, inputs, targets)
  np.testing.assert_allclose(_forward(noisy, params, inputs, targets), clean, **TOL)
  train = lambda key: _forward(noisy, params, inputs, targets, deterministic=False,
                               rngs={"dropout": jax.random.key(key)})
  assert not np.allclose(train(0), clean, atol=1e-3)
  np.testing.assert_array_equal(train(0), train(0))
  assert not np.allclose(train(0), train(1), atol=1e-3)


def test_shift_right_is_segment_aware():
  """Targets shift right by one with 0 (the start token) at the start of every packed segment."""
  targets = jnp.asarray([[5, 6, 7, 8, 9, 0]])
  seg = jnp.asarray([[1, 1, 2, 2, 2, 0]])
  np.testing.assert_array_equal(shift_right(targets, seg), [[0, 5, 0, 7, 8, 0]])
  np.testing.assert_array_equal(shift_right(targets), [[0, 5, 6, 7, 8, 9]])


@pytest.mark.parametrize("arch", ARCHS)
def test_excluded_ids_get_probability_zero_and_leave_the_rest_as_a_softmax_over_the_others(arch):
  """model.excluded_ids: those ids' logits are heads.EXCLUDED_LOGIT, every other logit is the
  model's without the key (same parameters), so the log-softmax equals NumPy's over the kept ids
  alone and the excluded ids have probability exactly 0; the loss stays finite, greedy decoding
  never picks them and sampling never draws them."""
  from transformer.infer import decoding
  from transformer.model import losses
  from transformer.model.heads import EXCLUDED_LOGIT
  cfg = _cfg(arch=arch)
  _, params = _init(cfg)
  masked = dataclasses.replace(cfg, excluded_ids="0,2-3,7")
  rng = np.random.default_rng(3)
  inputs, targets = rng.integers(1, SV, size=(B, 8)), rng.integers(4, V, size=(B, 8))
  targets[targets == 7] = 8
  plain = np.asarray(_forward(cfg, params, inputs, targets), np.float64)
  got = np.asarray(_forward(masked, params, inputs, targets))
  out, keep = [0, 2, 3, 7], np.setdiff1d(np.arange(V), [0, 2, 3, 7])
  assert (got[..., out] == EXCLUDED_LOGIT).all()
  np.testing.assert_allclose(got[..., keep], plain[..., keep], **TOL)
  kept = plain[..., keep] - plain[..., keep].max(-1, keepdims=True)
  want = kept - np.log(np.exp(kept).sum(-1, keepdims=True))
  log_p = np.asarray(jax.nn.log_softmax(jnp.asarray(got), axis=-1))
  np.testing.assert_allclose(log_p[..., keep], want, **TOL)
  assert (np.exp(log_p[..., out]) == 0).all()
  loss, _, weight = losses.cross_entropy(jnp.asarray(got), jnp.asarray(targets))
  np.testing.assert_allclose(float(loss), -np.take_along_axis(
      want, np.searchsorted(keep, targets)[..., None], -1).sum(), rtol=1e-5)
  assert float(weight) == targets.size
  flat = jnp.asarray(got.reshape(-1, V))
  assert not np.isin(np.asarray(flat.argmax(-1)), out).any()
  search = decoding.Search(method="sample", temperature=1.0, top_k=0, top_p=1.0)
  drawn = [decoding._choose(flat, jax.random.key(i), search)[0] for i in range(20)]  # pylint: disable=protected-access
  assert not np.isin(np.asarray(drawn), out).any()
