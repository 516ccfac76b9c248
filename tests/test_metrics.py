"""Tests of transformer/metrics.py against hand-made cases and independent references."""

import functools
import math

from hypothesis import given, settings, strategies as st
import pytest
import sacrebleu

from transformer import metrics


def _naive_distance(a, b):
  """Edit distance by its recursive definition (top-down, memoised): an independent reference."""
  @functools.lru_cache(maxsize=None)
  def d(i, j):
    if i == 0 or j == 0:
      return i + j
    return min(d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (a[i - 1] != b[j - 1]))
  return d(len(a), len(b))


def test_edit_distance_hand_cases():
  """Textbook distances: kitten/sitting 3, empty strings, identical, pure insertion, phoneme lists."""
  assert metrics.edit_distance("kitten", "sitting") == 3
  assert metrics.edit_distance("", "") == 0
  assert metrics.edit_distance("", "abc") == 3
  assert metrics.edit_distance("abc", "abc") == 0
  assert metrics.edit_distance("flaw", "lawn") == 2
  assert metrics.edit_distance(["K", "AE", "T"], ["K", "AA", "T", "S"]) == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=7), st.lists(st.integers(0, 3), max_size=7))
def test_edit_distance_matches_recursive_definition(a, b):
  """The row-by-row DP equals the recursive definition, and is symmetric, on random short sequences."""
  expected = _naive_distance(tuple(a), tuple(b))
  assert metrics.edit_distance(a, b) == expected
  assert metrics.edit_distance(b, a) == expected


def test_wer_per_multiple_references():
  """WER counts a word correct if it equals any reference; PER takes the closest reference per word."""
  hyps = [["K", "AE", "T"],            # equals the second reference: correct, 0 phone errors
          ["D", "AO", "G", "Z"],       # 1 from ref A (len 3), 2 from ref B (len 4): chooses A
          ["AH"]]                      # 2 from ["B", "AH", "T"] (len 3) and 2 from ["AH", "B", "T"]
  refs = [[["K", "AA", "T"], ["K", "AE", "T"]],
          [["D", "AO", "G"], ["D", "AA", "G", "Z"]],
          [["B", "AH", "T"], ["AH", "B", "T"]]]
  wer, per = metrics.wer_per(hyps, refs)
  assert wer == pytest.approx(2 / 3)
  assert per == pytest.approx((0 + 1 + 2) / (3 + 3 + 3))


def test_per_tie_takes_the_shorter_reference():
  """On equal distances the shorter reference is chosen (the stated rule), so PER is not lowered."""
  hyps = [["A", "B"]]
  refs = [[["A", "B", "C", "D"], ["X", "Y"]]]  # both at distance 2; lengths 4 and 2
  wer, per = metrics.wer_per(hyps, refs)
  assert wer == 1.0
  assert per == pytest.approx(2 / 2)


def test_wer_per_perfect_and_errors():
  """All words right gives 0/0; empty hypotheses give PER 1 (all deletions); bad input raises."""
  refs = [[["A", "B"]], [["C"]]]
  assert metrics.wer_per([["A", "B"], ["C"]], refs) == (0.0, 0.0)
  assert metrics.wer_per([[], []], refs) == (1.0, 1.0)
  with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
    metrics.wer_per([["A"], ["B"]], [[["A"]]])
  with pytest.raises(ValueError, match="word 0 has no reference"):
    metrics.wer_per([["A"]], [[]])


def test_bleu_equals_sacrebleu():
  """bleu() is sacrebleu.corpus_bleu with its default 13a tokenisation, on detokenised strings."""
  hyps = ["The cat sat on the mat.", "He read the book, slowly!", "a b c d e f"]
  refs = ["The cat is on the mat.", "He read the book slowly.", "a b c d e g"]
  expected = sacrebleu.corpus_bleu(hyps, [refs]).score
  assert metrics.bleu(hyps, refs) == pytest.approx(expected)
  assert 0.0 < expected < 100.0
  assert metrics.bleu(refs, refs) == pytest.approx(100.0)


def test_bleu_multiple_references():
  """A list of references per hypothesis becomes sacrebleu's reference streams."""
  hyps = ["the cat sat on the mat", "a dog ran in the park"]
  refs = [["the cat is on the mat", "the cat sat on the mat"],
          ["a dog runs in a park", "the dog ran in the park"]]
  expected = sacrebleu.corpus_bleu(hyps, [[r[0] for r in refs], [r[1] for r in refs]]).score
  assert metrics.bleu(hyps, refs) == pytest.approx(expected)
  assert metrics.bleu(hyps, refs) > metrics.bleu(hyps, [r[0] for r in refs])


def test_units():
  """bits = nats / ln 2; perplexity = exp, inf past overflow."""
  assert metrics.bits_per_unit(math.log(2.0) * 1.5) == pytest.approx(1.5)
  assert metrics.perplexity(math.log(4.0)) == pytest.approx(4.0)
  assert metrics.perplexity(1e4) == math.inf


def test_better_mode_knows_which_way_each_metric_improves():
  """Losses, error rates and bits improve downwards, BLEU, accuracy and F1 upwards (a _stress
  track as its metric); counts and unknown names have no direction."""
  assert [metrics.better_mode(m) for m in ("eval/loss", "dev/wer_stress", "test/bits_per_char",
                                           "eval/bleu", "test/f1", "accuracy")] == [
      "min", "min", "min", "max", "max", "max"]
  assert metrics.better_mode("eval/decoded_examples") is None
