"""transformer/model/scoring.py's per-class counts against a loop over positions in NumPy."""

import numpy as np

from transformer.model import scoring


def test_class_counts_weigh_each_position_once():
  """Fractional weights count a position by its weight, not its square: true positives,
  predictions, references and the confusion matrix [reference, predicted] equal a loop."""
  rng = np.random.default_rng(0)
  classes = 4
  predicted = rng.integers(0, classes, (3, 5))
  targets = rng.integers(0, classes, (3, 5))
  weights = rng.choice([0.0, 0.25, 0.5, 1.0], (3, 5)).astype(np.float32)
  tp, pred, ref = (np.zeros(classes) for _ in range(3))
  confusion = np.zeros((classes, classes))
  for p, t, w in zip(predicted.ravel(), targets.ravel(), weights.ravel()):
    pred[p] += w
    ref[t] += w
    tp[t] += w * (p == t)
    confusion[t, p] += w
  got = scoring.class_counts(predicted, targets, weights, classes)
  for name, want in (("true_positives", tp), ("predicted", pred), ("references", ref),
                     ("confusion", confusion)):
    np.testing.assert_allclose(np.asarray(got[name]), want, rtol=1e-6, err_msg=name)
  assert tp.sum() != (weights ** 2 * (predicted == targets)).sum()  # the weights are fractional
