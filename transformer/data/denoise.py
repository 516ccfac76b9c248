"""The self-supervised objectives (MaskedLM, SpanCorruption) as pipeline transforms.

A transform turns the raw ids (feature `inputs`) of the examples a batch takes into the features
the model trains on, drawing from a generator seeded by (seed, SALT, epoch, example index): a
resumed or re-sharded iterator masks as an uninterrupted one, every epoch masks afresh (RoBERTa's
dynamic masking), and evaluation (pipeline.EVAL_EPOCH) always scores the same draw. `lengths`
gives the output lengths before drawing, which packing needs.
"""

import json

import numpy as np

from transformer.data import objectives
from transformer.data.pipeline import Examples
from transformer.data.tokenizers import NUM_SPECIAL

SALT = 0x6D61736B  # keeps the objective's streams apart from the shuffling's


def word_starts_fn(tokenizer):
  """ids [n] -> bool [n], True where a word begins (whole-word masking); ValueError for a
  tokenizer whose units do not say where words begin."""
  kind = getattr(tokenizer, "kind", "")
  if kind in ("char", "byte"):
    space = np.array([i >= NUM_SPECIAL and tokenizer.decode([i]).isspace()
                      for i in range(tokenizer.vocab_size)])

    def starts(ids):
      sp = space[ids]
      return ~sp & np.concatenate([[True], sp[:-1]])
    return starts
  model = (json.loads(tokenizer.tokenizer_json).get("model") or {}) if kind == "hf" else {}
  if kind == "sentencepiece":
    sp = tokenizer._sp  # pylint: disable=protected-access
    begins = np.array([i >= NUM_SPECIAL and sp.id_to_piece(i).startswith("\u2581")
                       for i in range(tokenizer.vocab_size)])
  elif model.get("type") == "WordPiece":  # BERT's: a word's later pieces carry the prefix "##"
    prefix, offset = model.get("continuing_subword_prefix") or "##", tokenizer.offset
    hf = tokenizer._tok  # pylint: disable=protected-access
    begins = np.array([i >= max(offset, NUM_SPECIAL)
                       and not (hf.id_to_token(i - offset) or "").startswith(prefix)
                       for i in range(tokenizer.vocab_size)])
  else:
    raise ValueError(f"data.whole_word_masking=True needs a char, byte, sentencepiece or "
                     f"WordPiece ('hf', BERT's) tokenizer (word boundaries); this one is {kind!r}"
                     f"{' (' + repr(model.get('type')) + ')' if model else ''}")
  return lambda ids: begins[ids]


class _Transform:
  """Maps examples `idx` (each drawn for its epoch) to their `inputs` and `targets`: a subclass's
  `apply(ids, rng)` maps one example's ids."""

  seed: int

  def __call__(self, ex: Examples, idx: np.ndarray, epochs: np.ndarray) -> Examples:
    starts, lengths = ex.starts["inputs"], ex.lengths["inputs"]
    pairs = [self.apply(ex.tokens["inputs"][starts[i]:starts[i] + lengths[i]],
                        np.random.default_rng([self.seed, SALT, int(e), int(i)]))
             for i, e in zip(idx, epochs)]
    return Examples.from_lists({"inputs": [p[0] for p in pairs], "targets": [p[1] for p in pairs]})


class MaskedLM(_Transform):
  """BERT's masked LM over the ordinary ids of each example (special ids are never selected):
  `targets` is the original id on the selected positions, 0 (weight 0) elsewhere."""

  def __init__(self, extra: objectives.ExtraIds, seed: int, rate: float = 0.15,
               word_starts=None):
    self.extra, self.seed, self.rate, self.word_starts = extra, seed, rate, word_starts

  def lengths(self, ex: Examples) -> dict[str, np.ndarray]:
    return {"inputs": ex.lengths["inputs"], "targets": ex.lengths["inputs"]}

  def apply(self, ids: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One example's ids -> (inputs, targets with 0 where nothing is predicted)."""
    ids = np.asarray(ids, np.int32)
    inputs, targets = ids.copy(), np.zeros_like(ids)
    ordinary = np.flatnonzero(ids >= NUM_SPECIAL)
    if ordinary.size:
      starts = None if self.word_starts is None else self.word_starts(ids)[ordinary]
      masked, original, weights = objectives.bert_mask(ids[ordinary], self.extra, rng,
                                                       rate=self.rate, word_starts=starts)
      inputs[ordinary] = masked
      targets[ordinary] = np.where(weights > 0, original, 0)
    return inputs, targets


def span_lengths(n: np.ndarray, noise_density: float, mean_span_length: float
                 ) -> tuple[np.ndarray, np.ndarray]:
  """(inputs, targets) lengths, EOS included, of span-corrupting examples of n >= 2 ids: they
  depend on n alone (objectives.noise_span_mask)."""
  n = np.asarray(n, np.int64)
  noise = np.clip(np.round(n * noise_density).astype(np.int64), 1, n - 1)
  spans = np.maximum(np.round(noise / mean_span_length).astype(np.int64), 1)
  spans = np.minimum(np.minimum(spans, noise), n - noise)
  return n - noise + spans + 1, noise + spans + 1


class SpanCorruption(_Transform):
  """T5's span corruption of each example's ids (examples need at least 2 ids)."""

  def __init__(self, extra: objectives.ExtraIds, seed: int, noise_density: float = 0.15,
               mean_span_length: float = 3.0):
    self.extra, self.seed = extra, seed
    self.noise_density, self.mean_span_length = noise_density, mean_span_length

  def lengths(self, ex: Examples) -> dict[str, np.ndarray]:
    inputs, targets = span_lengths(ex.lengths["inputs"], self.noise_density,
                                   self.mean_span_length)
    return {"inputs": inputs, "targets": targets}

  def apply(self, ids: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return objectives.span_corrupt(ids, self.extra, rng, noise_density=self.noise_density,
                                   mean_span_length=self.mean_span_length)
