"""A tiny in-memory seq2seq task (reverse a digit string) with the transformer.data Task interface.

Used by the training-loop tests so they depend on neither TFDS nor the CMUdict data: batches come
from a checkpointable Grain iterator, each batch a pure function of its index.
"""

import dataclasses

import grain
import numpy as np

from configs import base

from shared_dirs import shared_dir

VOCAB = 12  # 0 pad, 1 eos, 2..11 the symbols
EOS = 1


@dataclasses.dataclass
class Tokenizer:
  vocab_size: int = VOCAB
  pad_id: int = 0
  eos_id: int = EOS
  bos_id: int = 0
  unk_id: int = 0

  def decode(self, ids):
    out = []
    for i in ids:
      if i == EOS:
        break
      if i > EOS:
        out.append(str(int(i) - 2))
    return " ".join(out)


def _example_batch(index: int, batch_size: int, length: int, seed: int) -> dict[str, np.ndarray]:
  """Batch `index`: random symbol strings as inputs, their reversal + EOS as targets (padded)."""
  rng = np.random.default_rng([seed, index])
  inputs = np.zeros((batch_size, length), np.int32)
  targets = np.zeros((batch_size, length), np.int32)
  for row in range(batch_size):
    n = int(rng.integers(2, length))
    symbols = rng.integers(2, VOCAB, n)
    inputs[row, :n] = symbols
    targets[row, :n] = symbols[::-1]
    targets[row, n] = EOS
  return dict(inputs=inputs, targets=targets, weights=(targets != 0).astype(np.float32))


class ReverseTask:
  """kind, tokenizers, train_iterator(), eval_batches(), eval_examples() as transformer.data.Task."""
  kind = "seq2seq"

  def __init__(self, batch_size: int = 8, length: int = 8, seed: int = 0, nan_batch: int = -1):
    self.batch_size, self.length, self.seed = batch_size, length, seed
    self.nan_batch = nan_batch  # this training batch gets a NaN weight (a poisoned loss)
    self.source_tokenizer = self.target_tokenizer = Tokenizer()

  def _train_batch(self, index: int) -> dict[str, np.ndarray]:
    batch = _example_batch(index, self.batch_size, self.length, self.seed)
    if index == self.nan_batch:
      batch["weights"][0, 0] = np.nan
    return batch

  def train_iterator(self):
    return iter(grain.MapDataset.range(0, 10**9).map(self._train_batch).to_iter_dataset())

  def eval_batches(self, split, batch_size=None):
    del split
    return [_example_batch(10**9 + i, batch_size or self.batch_size, self.length, self.seed + 1)
            for i in range(2)]

  def eval_examples(self, split):
    del split
    return []


def config(**overrides):
  """base.py with a 1+1-layer d=32 model sized for ReverseTask, fast enough for CPU tests."""
  cd = base.get_config()
  cd.model.update(d_model=32, num_heads=2, mlp_dim=64, num_encoder_layers=1,
                  num_decoder_layers=1, dropout_rate=0.1, max_len=16)
  cd.data.update(max_source_len=8, max_target_len=8, batch_size=8)
  cd.train.update(num_steps=40, optimizer="adam", schedule="constant", learning_rate=3e-3,
                  warmup_steps=0, log_every_steps=10)
  cd.eval.update(every_steps=20)
  cd.checkpoint.update(every_steps=10, keep=2)
  for key, value in overrides.items():
    section, name = key.split(".", 1) if "." in key else ("", key)
    target = cd[section] if section else cd
    for part in name.split(".")[:-1]:
      target = target[part]
    target[name.split(".")[-1]] = value
  return cd


def trained_run(tmp_path_factory, name: str, **overrides) -> str:
  """The workdir of a run of `config(**overrides)` on ReverseTask, trained once per pytest
  invocation under `name` and shared by the test files that ask for it (tests/shared_dirs.py)."""
  from transformer.train.loop import train_and_evaluate  # pylint: disable=g-import-not-at-top
  root = shared_dir(tmp_path_factory, f"synthetic_{name}", lambda root: train_and_evaluate(
      config(**overrides), str(root / "workdir"), task=ReverseTask()))
  return str(root / "workdir")
