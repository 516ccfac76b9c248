"""BERT masking and T5 span corruption (transformer/data/objectives.py), checked by their statistics
and by a naive pure-Python inverse that rebuilds the original sequence."""

import collections

import numpy as np
import pytest

from transformer.data import objectives
from transformer.data.tokenizers import EOS_ID, NUM_SPECIAL

EXTRA = objectives.ExtraIds(vocab_size=50, num_sentinels=40)


def _ids(n, rng):
  return rng.integers(NUM_SPECIAL, EXTRA.vocab_size, n).astype(np.int32)


def test_extra_ids_follow_the_tokenizer_vocabulary():
  """[MASK] and the sentinels sit after the tokenizer's ids, and the model vocab counts them."""
  assert EXTRA.mask_id == 50 and EXTRA.sentinel(0) == 51 and EXTRA.sentinel(39) == 90
  assert EXTRA.total_vocab_size == 91
  with pytest.raises(ValueError, match="sentinel 40 out of range"):
    EXTRA.sentinel(40)


def test_bert_mask_selects_exactly_the_budget_and_weights_only_those():
  """round(15% of n) positions get weight 1, the targets are the originals, the rest is untouched."""
  rng = np.random.default_rng(0)
  for n in (1, 7, 20, 64):
    ids = _ids(n, rng)
    inputs, targets, weights = objectives.bert_mask(ids, EXTRA, rng)
    assert weights.sum() == max(1, round(n * 0.15))
    np.testing.assert_array_equal(targets, ids)
    np.testing.assert_array_equal(inputs[weights == 0], ids[weights == 0])


def test_bert_mask_replacement_is_80_10_10_and_random_tokens_are_ordinary():
  """Over 40k selected positions: [MASK] 80%, a random ordinary token 10%, unchanged 10% (+-1%),
  where 'random' is counted where the id changed to something other than [MASK] (a random draw
  equal to the original counts as unchanged, as in BERT: 10% x 1/46 of all selections)."""
  rng = np.random.default_rng(1)
  counts = collections.Counter()
  random_ids = []
  for _ in range(2000):
    ids = _ids(133, rng)  # 20 selections each
    inputs, _, weights = objectives.bert_mask(ids, EXTRA, rng)
    sel = weights == 1
    masked = inputs[sel] == EXTRA.mask_id
    same = inputs[sel] == ids[sel]
    counts["mask"] += masked.sum()
    counts["same"] += same.sum()
    counts["random"] += (~masked & ~same).sum()
    random_ids.extend(inputs[sel][~masked & ~same])
  total = sum(counts.values())
  assert total == 2000 * 20
  p_same_by_chance = 0.1 / (EXTRA.vocab_size - NUM_SPECIAL)
  assert abs(counts["mask"] / total - 0.8) < 0.01
  assert abs(counts["random"] / total - (0.1 - p_same_by_chance)) < 0.01
  assert abs(counts["same"] / total - (0.1 + p_same_by_chance)) < 0.01
  random_ids = np.asarray(random_ids)
  assert random_ids.min() >= NUM_SPECIAL and random_ids.max() < EXTRA.vocab_size


def test_whole_word_masking_never_splits_a_word():
  """With word starts, each word is entirely selected or entirely not, within the budget."""
  rng = np.random.default_rng(2)
  for _ in range(200):
    n = int(rng.integers(5, 60))
    starts = rng.random(n) < 0.3
    starts[0] = True
    _, _, weights = objectives.bert_mask(_ids(n, rng), EXTRA, rng, word_starts=starts)
    word = np.cumsum(starts)
    for w in np.unique(word):
      assert len(set(weights[word == w])) == 1, (starts, weights)
    budget = max(1, round(n * 0.15))
    shortest = np.bincount(word)[1:].min()
    assert weights.sum() <= max(budget, shortest)
    assert weights.sum() >= 1


def _naive_uncorrupt(inputs, targets):
  """Rebuilds the original ids: every sentinel in the inputs is replaced by the tokens that follow
  the same sentinel in the targets (pure Python, independent of the implementation)."""
  spans, current = {}, None
  for t in targets:
    if t == EOS_ID:
      break
    if t > EXTRA.mask_id:
      current = int(t)
      spans[current] = []
    else:
      spans[current].append(int(t))
  out = []
  for t in inputs:
    if t == EOS_ID:
      break
    out.extend(spans[int(t)] if t > EXTRA.mask_id else [int(t)])
  return out


def test_span_corruption_loses_nothing_and_matches_t5_counts():
  """Inputs + targets rebuild the example exactly; noise tokens = round(15% n), spans =
  round(noise / 3), sentinels numbered in order, nothing starts with a sentinel, EOS appended."""
  rng = np.random.default_rng(3)
  for n in (2, 3, 10, 31, 100, 512):
    ids = _ids(n, rng)
    inputs, targets = objectives.span_corrupt(ids, EXTRA, rng)
    assert inputs[-1] == EOS_ID and targets[-1] == EOS_ID
    assert _naive_uncorrupt(inputs, targets) == ids.tolist()
    num_noise = min(max(round(n * 0.15), 1), n - 1)
    num_spans = min(max(round(num_noise / 3), 1), num_noise, n - num_noise)
    sentinels = [t for t in targets if t > EXTRA.mask_id]
    assert sentinels == [EXTRA.sentinel(i) for i in range(num_spans)]
    assert len(targets) - 1 - num_spans == num_noise
    assert inputs[0] <= EXTRA.mask_id  # starts with a kept token


def test_span_lengths_are_a_uniform_random_segmentation():
  """5 noise tokens in 2 spans: the 4 compositions (1+4, 2+3, 3+2, 4+1) are equally likely, and
  the mean noise span length over long sequences is the configured 3."""
  rng = np.random.default_rng(4)
  seen = collections.Counter(tuple(objectives._random_segmentation(5, 2, rng)) for _ in range(8000))
  assert set(seen) == {(1, 4), (2, 3), (3, 2), (4, 1)}
  assert all(abs(c / 8000 - 0.25) < 0.02 for c in seen.values())
  lengths = []
  for _ in range(200):
    mask = objectives.noise_span_mask(1000, rng)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    lengths.extend(edges[1::2] - edges[0::2])
  assert abs(np.mean(lengths) - 3.0) < 0.05


def test_span_corruption_rejects_a_one_token_example():
  with pytest.raises(ValueError, match="at least 2 tokens"):
    objectives.span_corrupt(np.array([7]), EXTRA, np.random.default_rng(0))


def mask_batch(tokens: np.ndarray, segment_ids: np.ndarray, extra: objectives.ExtraIds,
               rng: np.random.Generator, *, rate: float = 0.15,
               word_starts: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """A batch of ids [rows, length] with segment ids -> the masked-LM features.

  Each segment (one example; 0 = padding) is masked on its own by `bert_mask`, so the budget is
  per example and padding is never selected. Returns `inputs` (the corrupted ids), `targets` (the
  original ids) and `weights` (1 on the positions to predict), all [rows, length]. `word_starts`
  [rows, length] enables whole-word masking.
  """
  inputs, targets = tokens.copy(), tokens.copy()
  weights = np.zeros(tokens.shape, np.float32)
  for r in range(tokens.shape[0]):
    for s in np.unique(segment_ids[r]):
      if s == 0:
        continue
      at = np.flatnonzero(segment_ids[r] == s)
      starts = None if word_starts is None else word_starts[r, at]
      inputs[r, at], _, weights[r, at] = objectives.bert_mask(tokens[r, at], extra, rng, rate=rate,
                                                   word_starts=starts)
  return {"inputs": inputs, "targets": targets, "weights": weights}


def test_mask_batch_masks_each_packed_example_on_its_own_and_never_padding():
  """A packed batch: every segment gets its own round(15%) budget, padding keeps id 0 and weight 0,
  and the same seed gives the same batch (so a resumed pipeline reproduces it)."""
  rng = np.random.default_rng(5)
  tokens = np.zeros((3, 40), np.int32)
  seg = np.zeros((3, 40), np.int32)
  lengths = {(0, 1): 20, (0, 2): 13, (1, 1): 40, (2, 1): 7}
  for (r, s), n in lengths.items():
    start = int((seg[r] != 0).sum())
    tokens[r, start:start + n] = _ids(n, rng)
    seg[r, start:start + n] = s
  a = mask_batch(tokens, seg, EXTRA, np.random.default_rng(9))
  b = mask_batch(tokens, seg, EXTRA, np.random.default_rng(9))
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  for (r, s), n in lengths.items():
    assert a["weights"][r][seg[r] == s].sum() == max(1, round(n * 0.15))
  assert (a["weights"][seg == 0] == 0).all() and (a["inputs"][seg == 0] == 0).all()
  np.testing.assert_array_equal(a["targets"], tokens)
