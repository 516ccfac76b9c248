"""Self-supervised objectives on one example's ids: BERT's masked LM and T5's span corruption,
pure NumPy functions of the ids and a `numpy.random.Generator` (denoise.py seeds one per example
and epoch). Their extra ids follow the tokenizer's (`ExtraIds`): [MASK] is `vocab_size`, sentinel
i is `vocab_size + 1 + i` (T5 counts down from its top instead).
"""

import dataclasses

import numpy as np

from transformer.data.tokenizers import EOS_ID, NUM_SPECIAL

MASK_FRACTION, RANDOM_FRACTION = 0.8, 0.1  # BERT's: of the selected ids, to [MASK], to random


@dataclasses.dataclass(frozen=True)
class ExtraIds:
  """The ids the objectives add after a tokenizer's `vocab_size` ids."""
  vocab_size: int  # the tokenizer's vocabulary, special ids included
  num_sentinels: int = 100

  @property
  def mask_id(self) -> int:
    return self.vocab_size

  def sentinel(self, i: int) -> int:
    if not 0 <= i < self.num_sentinels:
      raise ValueError(f"sentinel {i} out of range: {self.num_sentinels} sentinels "
                       f"(raise the objective's num_sentinels)")
    return self.vocab_size + 1 + i

  @property
  def total_vocab_size(self) -> int:
    """The model's vocabulary: the tokenizer's ids, [MASK] and the sentinels."""
    return self.vocab_size + 1 + self.num_sentinels


def _select_for_masking(n: int, rate: float, rng: np.random.Generator,
                        word_starts: np.ndarray | None) -> np.ndarray:
  """Boolean [n]: the positions to predict, round(n * rate) of them (at least one). With
  `word_starts` (True where a word begins), whole words in a random order while they fit the
  budget, as BERT's whole-word masking."""
  budget = max(1, int(round(n * rate)))
  selected = np.zeros(n, bool)
  if word_starts is None:
    selected[rng.permutation(n)[:budget]] = True
    return selected
  starts = np.flatnonzero(word_starts)
  if starts.size == 0 or starts[0] != 0:
    starts = np.concatenate([[0], starts])
  ends = np.append(starts[1:], n)
  taken = 0
  for w in rng.permutation(starts.size):
    size = ends[w] - starts[w]
    if taken + size > budget:
      continue
    selected[starts[w]:ends[w]] = True
    taken += size
    if taken == budget:
      break
  if taken == 0:  # every word is longer than the budget: take the shortest one whole
    w = int(np.argmin(ends - starts))
    selected[starts[w]:ends[w]] = True
  return selected


def bert_mask(ids: np.ndarray, extra: ExtraIds, rng: np.random.Generator, *, rate: float = 0.15,
              word_starts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """One example's ids [n] -> (inputs [n], targets [n] = ids, weights [n] float32: 1 on the
  selected positions). Of those, MASK_FRACTION become [MASK], RANDOM_FRACTION a random ordinary
  token, the rest keep their id, drawn per position as in BERT."""
  ids = np.asarray(ids, np.int32)
  n = ids.shape[0]
  if n == 0:
    return ids.copy(), ids.copy(), np.zeros(0, np.float32)
  selected = _select_for_masking(n, rate, rng, word_starts)
  u = rng.random(n)
  inputs = ids.copy()
  to_mask = selected & (u < MASK_FRACTION)
  to_random = selected & (u >= MASK_FRACTION) & (u < MASK_FRACTION + RANDOM_FRACTION)
  inputs[to_mask] = extra.mask_id
  inputs[to_random] = rng.integers(NUM_SPECIAL, extra.vocab_size, int(to_random.sum()))
  return inputs, ids.copy(), selected.astype(np.float32)


def _random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
  """A uniformly random split of `num_items` into `num_segments` non-empty lengths (in order)."""
  cuts = np.sort(rng.choice(np.arange(1, num_items), num_segments - 1, replace=False))
  return np.diff(np.concatenate([[0], cuts, [num_items]]))


def noise_span_mask(n: int, rng: np.random.Generator, *, noise_density: float = 0.15,
                    mean_span_length: float = 3.0) -> np.ndarray:
  """Boolean [n], True on the corrupted tokens: T5's `random_spans_noise_mask` (noise and kept
  spans interleaved, kept first, so no sequence starts with a sentinel)."""
  if n < 2:
    raise ValueError(f"span corruption needs at least 2 tokens, got {n}")
  num_noise = min(max(int(round(n * noise_density)), 1), n - 1)
  num_spans = max(int(round(num_noise / mean_span_length)), 1)
  num_spans = min(num_spans, num_noise, n - num_noise)
  noise_lengths = _random_segmentation(num_noise, num_spans, rng)
  keep_lengths = _random_segmentation(n - num_noise, num_spans, rng)
  lengths = np.stack([keep_lengths, noise_lengths], axis=1).reshape(-1)
  is_noise = np.tile([False, True], num_spans)
  return np.repeat(is_noise, lengths)


def span_corrupt(ids: np.ndarray, extra: ExtraIds, rng: np.random.Generator, *,
                 noise_density: float = 0.15, mean_span_length: float = 3.0
                 ) -> tuple[np.ndarray, np.ndarray]:
  """One example's ids [n] -> (inputs, targets) of T5's span corruption: "a b c d e f" with spans
  {b c} and {e} -> "a <s0> d <s1> f", "<s0> b c <s1> e", each + EOS."""
  ids = np.asarray(ids, np.int32)
  noise = noise_span_mask(ids.shape[0], rng, noise_density=noise_density,
                          mean_span_length=mean_span_length)
  span_starts = noise & ~np.concatenate([[False], noise[:-1]])
  num_spans = int(span_starts.sum())
  sentinels = np.array([extra.sentinel(i) for i in range(num_spans)], np.int32)
  with_sentinels = ids.copy()
  with_sentinels[span_starts] = sentinels
  inputs = with_sentinels[~noise | span_starts]  # each span collapses to its sentinel
  targets = np.insert(ids[noise], np.flatnonzero(span_starts[noise]), sentinels)
  return np.append(inputs, EOS_ID).astype(np.int32), np.append(targets, EOS_ID).astype(np.int32)
