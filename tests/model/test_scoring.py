"""transformer/model/scoring.py's per-class counts against a loop over positions in NumPy."""

import numpy as np
import pytest

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


def test_in_training_metrics_are_what_the_evaluation_logs():
  """in_training_metrics names the teacher-forced keys of the eval step's sums (and the moe_* of
  a mixture, f1 of a classifier), the decoded metrics of a task that decodes; a key or flag
  naming another (checkpoint.keep_best_by='eval/wr') is one ConfigError listing them."""
  from configs import base, classify  # pylint: disable=g-import-not-at-top
  from transformer.config import ConfigError, from_configdict  # pylint: disable=g-import-not-at-top
  from transformer.train import start  # pylint: disable=g-import-not-at-top
  cd = base.get_config()
  seq2seq = scoring.in_training_metrics(from_configdict(cd))
  assert seq2seq[:4] == ["eval/loss", "eval/accuracy", "eval/perplexity", "eval/scored_tokens"]
  assert {"eval/wer", "eval/per_stress", "eval/bleu", "eval/decoded_examples"} <= set(seq2seq)
  sums = {"loss_sum": 2.0, "weight_sum": 4.0, "correct_sum": 1.0}
  assert set(scoring.teacher_forced_metrics(sums, "eval/")) <= set(seq2seq)
  cd.model.ffn = "moe"
  assert "eval/moe_dropped" in scoring.in_training_metrics(from_configdict(cd))
  assert "eval/f1" in scoring.in_training_metrics(from_configdict(classify.get_config()))
  cd.checkpoint.keep_best_by = "eval/wr"
  with pytest.raises(ConfigError, match=r"^checkpoint.keep_best_by='eval/wr' is not a metric this "
                     r"config's in-training evaluations log; they log eval/loss, "):
    start.check_loop_config(from_configdict(cd))
