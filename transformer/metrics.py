"""Host-side evaluation metrics: bits per unit, perplexity, edit distance, WER/PER (G2P), corpus
BLEU, macro F1."""

from collections.abc import Hashable, Sequence
import math

import numpy as np
import sacrebleu


# Which way a metric improves, by its name after the last '/' (a `_stress` track as its metric).
HIGHER_IS_BETTER = ("bleu", "accuracy", "f1", "tokens_per_sec")
LOWER_IS_BETTER = ("loss", "wer", "per", "cer", "perplexity", "bits_per_char", "bits_per_byte",
                   "bits_per_token")


def better_mode(metric: str) -> str | None:
  """'max' for a metric where higher is better, 'min' where lower is, None for one that is
  neither (counts such as decoded_examples) or unknown."""
  name = metric.rsplit("/", 1)[-1].removesuffix("_stress")
  return "max" if name in HIGHER_IS_BETTER else "min" if name in LOWER_IS_BETTER else None


def bits_per_unit(loss_nats: float) -> float:
  """Mean cross-entropy in nats per unit (character, byte, token) -> bits per unit."""
  return float(loss_nats) / math.log(2.0)


def perplexity(loss_nats: float) -> float:
  """exp(mean loss in nats); inf instead of an overflow error for a diverged model."""
  loss_nats = float(loss_nats)
  return math.exp(loss_nats) if loss_nats < 700.0 else math.inf


def edit_distance(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
  """Levenshtein distance (unit-cost insertions, deletions, substitutions) between two sequences."""
  if len(a) < len(b):
    a, b = b, a  # keep the row over the shorter sequence
  previous = list(range(len(b) + 1))
  for i, x in enumerate(a, start=1):
    current = [i]
    for j, y in enumerate(b, start=1):
      current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
    previous = current
  return previous[-1]


def wer_per(hypotheses: Sequence[Sequence[str]],
            references: Sequence[Sequence[Sequence[str]]]) -> tuple[float, float]:
  """(WER, PER) as fractions for G2P: hypotheses[i] is word i's phoneme list, references[i] its
  accepted pronunciations. WER: the share of words matching none. PER: the summed edit distances
  to each word's closest reference (on a tie the shorter, which never lowers PER) over the summed
  lengths of those references."""
  if len(hypotheses) != len(references):
    raise ValueError(f"wer_per: {len(hypotheses)} hypotheses but {len(references)} references")
  if not hypotheses:
    raise ValueError("wer_per: no words to score")
  word_errors, phone_errors, phone_total = 0, 0, 0
  for i, (hyp, refs) in enumerate(zip(hypotheses, references)):
    if not refs:
      raise ValueError(f"wer_per: word {i} has no reference pronunciation")
    hyp = list(hyp)
    word_errors += not any(hyp == list(ref) for ref in refs)
    distance, length = min((edit_distance(hyp, ref), len(ref)) for ref in refs)
    phone_errors += distance
    phone_total += length
  per = phone_errors / phone_total if phone_total else float(phone_errors > 0)
  return word_errors / len(hypotheses), per


def bleu(hypotheses: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]]) -> float:
  """Corpus BLEU (0-100, sacrebleu's 13a tokenisation) of detokenised strings; references holds
  one string per hypothesis or an equally long list of strings per hypothesis."""
  if len(hypotheses) != len(references):
    raise ValueError(f"bleu: {len(hypotheses)} hypotheses but {len(references)} references")
  streams = [list(references)]
  if references and not isinstance(references[0], str):
    counts = {len(r) for r in references}
    if len(counts) != 1:
      raise ValueError(f"bleu: every hypothesis needs the same number of references, got {counts}")
    streams = [[r[j] for r in references] for j in range(counts.pop())]
  return float(sacrebleu.corpus_bleu(list(hypotheses), streams).score)


def macro_f1(true_positives, predicted, references) -> float:
  """Macro-averaged F1 from per-class counts [c] over the classes that occur (0.0 if none does)."""
  tp, pred, ref = (np.asarray(x, np.float64) for x in (true_positives, predicted, references))
  seen = (pred + ref) > 0
  return float(np.mean(2 * tp[seen] / (pred[seen] + ref[seen]))) if seen.any() else 0.0
