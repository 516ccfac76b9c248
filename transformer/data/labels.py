"""Examples of the encoder-only tasks and of the self-supervised objectives, and CMUdict labels.
Encoder-only rows are BERT's: BOS (the [CLS] that pooling reads) + the text's ids + EOS ([SEP]);
`targets` holds one label id per example (classify: a packed row's i-th target slot is its i-th
example, see transformer/model/heads.py) or one tag per token (tag; 0, unscored, under BOS/EOS).
"""

from collections.abc import Sequence

import numpy as np

from transformer.data.pipeline import encode_stream, Examples, fit
from transformer.data.tokenizers import BOS_ID, EOS_ID

LABELS = ("none", "primary_stress", "syllables")


def label_of(phones: str, label: str) -> str:
  """The class label of a CMUdict pronunciation with stress digits ('HH AH0 L OW1' -> '2'):
  `primary_stress` is the 1-based vowel with stress 1 (0: none), `syllables` the vowel count."""
  vowels = [p for p in phones.split() if p[-1:].isdigit()]
  if label == "syllables":
    return str(len(vowels))
  if label == "primary_stress":
    return str(next((i + 1 for i, p in enumerate(vowels) if p.endswith("1")), 0))
  raise ValueError(f"data.label={label!r} is not one of {'|'.join(LABELS)}")


def word_labels(records: Sequence[tuple[str, str]], label: str) -> list[tuple[str, str]]:
  """(word, label) per distinct word, from its first pronunciation (CMU's order); records without
  any stress digit (no_stress data) are a ValueError."""
  first: dict[str, str] = {}
  for word, phones in records:
    first.setdefault(word, phones)
  out = [(word, label_of(phones, label)) for word, phones in first.items()]
  if records and not any(p[-1:].isdigit() for _, phones in records for p in phones.split()):
    raise ValueError(f"data.label={label!r}: the pronunciations carry no stress digits; use "
                     f"data.dataset='cmudict_g2p/stress'")
  return out


def encoder_rows(texts: Sequence[str], tok, max_len: int, too_long: str
                 ) -> tuple[list[list[int]], list[int]]:
  """BOS + ids + EOS per text within max_len (truncated or dropped); (rows, kept text indices)."""
  rows, kept = [], []
  for i, text in enumerate(texts):
    ids = fit(tok.encode(text), max_len - 2, too_long)
    if ids is not None:
      rows.append([BOS_ID] + ids + [EOS_ID])
      kept.append(i)
  return rows, kept


def head_examples(pairs: Sequence[tuple[str, str]], source_tok, target_tok, max_len: int,
                  too_long: str, head: str) -> tuple[Examples, dict[str, int]]:
  """Encoder rows with one label id each (head 'classify') or one tag per token ('tag'; 0 under
  BOS and EOS); a label of other than one id, or fewer tags than tokens, is a ValueError."""
  rows, kept = encoder_rows([s for s, _ in pairs], source_tok, max_len, too_long)
  targets = []
  for row, i in zip(rows, kept):
    (source, label), n = pairs[i], len(row) - 2  # n: the text's tokens
    ids = target_tok.encode(label)
    if head == "classify" and len(ids) != 1:
      raise ValueError(f"model.head='classify': the label {label!r} of {source!r} is "
                       f"{len(ids)} tokens, not one (data.tokenizer={target_tok.kind!r})")
    if head == "tag" and len(ids) < n:
      raise ValueError(f"model.head='tag': {source!r} has {n} tokens but {len(ids)} tags "
                       f"({label!r})")
    targets.append(ids if head == "classify" else [0] + ids[:n] + [0])
  counts = {"examples": len(rows), "dropped": len(pairs) - len(rows), "truncated": 0}
  return Examples.from_lists({"inputs": rows, "targets": targets}), counts


def objective_examples(texts: Sequence[str], tok, row_len: int, stream: bool, wrap: bool,
                       too_long: str) -> tuple[Examples, dict[str, int]]:
  """Raw `inputs` ids for an objective: LM text cut into rows of row_len (`stream`), else one
  example per text (an encoder row when `wrap`); fewer than 2 ids are left out (span needs 2)."""
  if stream:
    ex = encode_stream(texts, tok, row_len)
    rows = [ex.tokens["targets"][s:s + n] for s, n in zip(ex.starts["targets"],
                                                          ex.lengths["targets"])]
  elif wrap:
    rows = encoder_rows(texts, tok, row_len, too_long)[0]
  else:
    rows = [ids for ids in (fit(tok.encode(t), row_len, too_long) for t in texts)
            if ids is not None]
  kept = [list(r) for r in rows if len(r) >= 2]
  counts = {"examples": len(kept), "dropped": len(texts) - len(kept) if not stream else 0,
            "truncated": 0}
  return Examples.from_lists({"inputs": kept}), counts


def subset(ex: Examples, fraction: float, seed: int = 0) -> Examples:
  """The first round(n * fraction) (at least 1) examples of a fixed permutation, in split order:
  smaller fractions are subsets of larger ones."""
  if fraction >= 1.0:
    return ex
  keep = np.random.default_rng(seed).permutation(len(ex))[:max(1, round(len(ex) * fraction))]
  return ex.select(np.sort(keep))
