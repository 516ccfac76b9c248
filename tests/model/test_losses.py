"""Tests for transformer.model.losses against a naive NumPy reference."""

import jax.numpy as jnp
import numpy as np
import pytest

from transformer.model.losses import cross_entropy


def _reference(logits, targets, weights, ls, z):
  """Loop-by-loop smoothed cross-entropy minus the target entropy, plus z-loss; NumPy float64."""
  b, t, v = logits.shape
  loss_sum = z_sum = 0.0
  for i in range(b):
    for j in range(t):
      row = logits[i, j].astype(np.float64)
      lse = np.log(np.sum(np.exp(row - row.max()))) + row.max()
      log_p = row - lse
      q = np.full(v, ls / (v - 1))
      q[targets[i, j]] = 1.0 - ls
      entropy = -sum(qc * np.log(qc) for qc in q if qc > 0)
      zl = z * lse**2
      loss_sum += weights[i, j] * (-(q * log_p).sum() - entropy + zl)
      z_sum += weights[i, j] * zl
  return loss_sum, z_sum, weights.sum()


@pytest.mark.parametrize("ls,z", [(0.0, 0.0), (0.1, 0.0), (0.2, 1e-3)])
def test_matches_numpy_reference(ls, z):
  """Summed loss, z-loss and weight total equal the explicit per-token NumPy formula."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 7)).astype(np.float32) * 3
  targets = rng.integers(0, 7, size=(3, 5))
  weights = rng.uniform(size=(3, 5)).astype(np.float32)
  weights[0, 2] = 0.0
  got = cross_entropy(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights),
                      label_smoothing=ls, z_loss=z)
  want = _reference(logits, targets, weights, ls, z)
  np.testing.assert_allclose(np.array(got, np.float64), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ls", [0.0, 0.1])
def test_excluded_ids_are_not_classes(ls):
  """With `excluded` ids (model.excluded_ids: logits -1e30, probability 0), the loss is the
  NumPy formula over the other classes alone: finite, and smoothing spreads label_smoothing /
  (n - 1) over the n kept classes only."""
  from transformer.model.heads import EXCLUDED_LOGIT
  rng = np.random.default_rng(1)
  v, excluded = 9, (0, 2, 3, 7)
  kept = np.setdiff1d(np.arange(v), excluded)
  small = rng.normal(size=(2, 4, kept.size)).astype(np.float32) * 3
  logits = np.full((2, 4, v), EXCLUDED_LOGIT, np.float32)
  logits[..., kept] = small
  index = rng.integers(0, kept.size, size=(2, 4))
  weights = rng.uniform(size=(2, 4)).astype(np.float32)
  got = cross_entropy(jnp.asarray(logits), jnp.asarray(kept[index]), jnp.asarray(weights),
                      label_smoothing=ls, excluded=excluded)
  want = _reference(small, index, weights, ls, 0.0)
  np.testing.assert_allclose(np.array(got, np.float64), want, rtol=1e-5, atol=1e-5)


def test_perfect_prediction_scores_zero():
  """Logits whose softmax equals the smoothed target give loss 0 (the entropy is subtracted)."""
  v, ls = 6, 0.1
  targets = np.array([[0, 3, 5]])
  q = np.full((1, 3, v), ls / (v - 1))
  q[0, np.arange(3), targets[0]] = 1 - ls
  logits = jnp.asarray(np.log(q) + 4.0, jnp.float32)  # softmax is shift invariant
  loss, _, _ = cross_entropy(logits, jnp.asarray(targets), None, label_smoothing=ls)
  assert abs(float(loss)) < 1e-5
  worse, _, _ = cross_entropy(logits * 0, jnp.asarray(targets), None, label_smoothing=ls)
  assert float(worse) > 0.1


def test_weighted_out_positions_contribute_nothing():
  """Positions with weight 0 leave all three sums unchanged, even with huge garbage logits."""
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(2, 4, 5)).astype(np.float32)
  targets = rng.integers(0, 5, size=(2, 4))
  weights = np.ones((2, 4), np.float32)
  weights[1, 2:] = 0.0
  base = cross_entropy(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights), 0.1, 1e-2)
  garbage = logits.copy()
  garbage[1, 2:] = 1e30
  other_targets = targets.copy()
  other_targets[1, 2:] = (targets[1, 2:] + 1) % 5
  got = cross_entropy(jnp.asarray(garbage), jnp.asarray(other_targets), jnp.asarray(weights),
                      0.1, 1e-2)
  np.testing.assert_array_equal(np.array(got), np.array(base))
  # Also equal to the loss of the kept positions alone.
  kept = cross_entropy(jnp.asarray(logits[1:, :2]), jnp.asarray(targets[1:, :2]), None, 0.1, 1e-2)
  first = cross_entropy(jnp.asarray(logits[:1]), jnp.asarray(targets[:1]), None, 0.1, 1e-2)
  np.testing.assert_allclose(np.array(base), np.array(kept) + np.array(first), rtol=1e-6)


def test_sums_make_accumulation_exact():
  """Loss sums of two halves add up to the loss sum of the whole batch (exact averaging)."""
  rng = np.random.default_rng(2)
  logits = jnp.asarray(rng.normal(size=(4, 3, 9)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 9, size=(4, 3)))
  weights = jnp.asarray(rng.integers(0, 2, size=(4, 3)), jnp.float32)
  whole = np.array(cross_entropy(logits, targets, weights, 0.1))
  halves = (np.array(cross_entropy(logits[:2], targets[:2], weights[:2], 0.1))
            + np.array(cross_entropy(logits[2:], targets[2:], weights[2:], 0.1)))
  np.testing.assert_allclose(whole, halves, rtol=1e-6)


def test_bad_shapes_give_one_line_error():
  """Mismatched logits/targets/weights shapes raise a ValueError naming the shapes."""
  with pytest.raises(ValueError, match="logits"):
    cross_entropy(jnp.zeros((2, 3, 5)), jnp.zeros((2, 4), jnp.int32))
  with pytest.raises(ValueError, match="weights"):
    cross_entropy(jnp.zeros((2, 3, 5)), jnp.zeros((2, 3), jnp.int32), jnp.zeros((3, 2)))
