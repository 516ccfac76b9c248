"""transformer/train/prefetch.py: batches made ahead on a thread are the inner iterator's batches, and
the state it checkpoints is the state after the last batch taken, never after those made ahead."""

import numpy as np
import pytest

import synthetic_task
from transformer.data import pipeline
from transformer.train import prefetch


def _batches(n=40, rows=4):
  lengths = np.random.default_rng(0).integers(1, 9, n)
  feats = {"inputs": [list(range(2, 2 + int(k))) for k in lengths],
           "targets": [list(range(3, 3 + int(k))) for k in lengths]}
  ex = pipeline.Examples.from_lists(feats)
  return pipeline.BatchDataset(ex, rows=rows, row_len={"inputs": 8, "targets": 8}, mode="pack",
                               seed=3)


def _equal(a, b):
  return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("depth", [1, 3])
def test_same_batches_and_state_of_the_last_batch_taken(depth):
  """Across epochs, the wrapped iterator yields the plain one's batches; after k batches its state
  is the plain iterator's after k (the thread is ahead), and restoring that state into a fresh
  wrapped iterator continues with batch k+1."""
  ds = _batches()
  plain, wrapped = iter(ds), prefetch.Prefetch(iter(ds), depth)
  states = []
  for _ in range(25):
    assert _equal(next(plain), next(wrapped))
    states.append((plain.get_state(), wrapped.get_state()))
  assert all(p == w for p, w in states)
  resumed = prefetch.Prefetch(iter(ds), depth)
  resumed.set_state(states[9][1])
  check = iter(ds)
  check.set_state(states[9][0])
  for _ in range(5):
    assert _equal(next(resumed), next(check))
  for it in (wrapped, resumed):
    it.close()


def test_an_error_in_the_thread_is_raised_by_next():
  class Failing:
    def __init__(self):
      self.n = 0

    def get_state(self):
      return {"n": self.n}

    def __next__(self):
      self.n += 1
      if self.n == 3:
        raise ValueError("bad shard")
      return {"x": np.array([self.n])}

  it = prefetch.Prefetch(Failing(), 2)
  assert next(it)["x"][0] == 1 and next(it)["x"][0] == 2
  with pytest.raises(ValueError, match="bad shard"):
    next(it)
  it.close()


def test_training_with_and_without_prefetch_is_the_same(tmp_path):
  """data.prefetch=3 and 0 log the same train losses and end at the same eval loss, resumed
  midway or not: the checkpointed iterator state is the loop's position."""
  from transformer.train import loop  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top

  def losses(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f]
    return [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]

  out = {}
  for depth in (0, 3):
    workdir = str(tmp_path / f"p{depth}")
    if depth:  # stopped at step 20, then resumed to 30
      loop.train_and_evaluate(synthetic_task.config(**{
          "train.num_steps": 20, "data.prefetch": depth}), workdir,
          task=synthetic_task.ReverseTask())
    out[depth] = loop.train_and_evaluate(synthetic_task.config(**{
        "train.num_steps": 30, "data.prefetch": depth}), workdir,
        task=synthetic_task.ReverseTask())
    out[f"losses{depth}"] = losses(workdir)
  assert out["losses3"] == out["losses0"]
  assert out[3]["eval/loss"] == out[0]["eval/loss"]
