"""Pipelines: packing, bucketing, determinism, checkpointable state, per-host sharding, eval."""

import json
import random
import sys

import grain
import numpy as np
import pytest

from configs import base
from transformer.config import from_configdict
from transformer.data import load_task, pipeline
from transformer.data.tokenizers import EOS_ID

ALPHABET = "abcdefgh"


def make_cfg(**data):
  c = base.get_config()
  c.model.arch = data.pop("arch", "encoder_decoder")
  for k, v in data.items():
    c.data[k] = v
  return from_configdict(c)


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
  """A toy G2P-like tsv: 200 random words -> upper-case letters spelled as symbols."""
  rng = random.Random(0)
  d = tmp_path_factory.mktemp("pairs")
  words = sorted({"".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 9)))
                  for _ in range(260)})[:200]
  lines = [f"{w}\t{' '.join(w.upper())}" for w in words]
  (d / "train.tsv").write_text("\n".join(lines) + "\n")
  (d / "dev.tsv").write_text("\n".join(lines[:37]) + f"\n{words[0]}\tX Y\n")  # 2 references
  return d


def toy_task(pairs_file, tmp_path_factory, index=0, count=1, workdir=None, **data):
  kw = dict(dataset="tsv_pairs", train_file=str(pairs_file / "train.tsv"),
            dev_file=str(pairs_file / "dev.tsv"), data_dir=str(pairs_file / "tfds"),
            max_source_len=16, max_target_len=16, batch_size=4)
  kw.update(data)
  return load_task(make_cfg(**kw), workdir, process_index=index, process_count=count)


def unpack(batch, name):
  """Naive reference: per row, the token lists of each segment id, in order."""
  out = []
  for r in range(batch[name].shape[0]):
    seg = batch[f"{name}_segment_ids"][r]
    for s in range(1, seg.max() + 1):
      out.append(batch[name][r][seg == s].tolist())
  return out


def expected_pairs(task, split="train"):
  """Reference encoding of the split straight from the tokenizers (source + EOS, target + EOS)."""
  return sorted((tuple(task.source_tokenizer.encode(s) + [EOS_ID]),
                 tuple(task.target_tokenizer.encode(t) + [EOS_ID]))
                for s, t in task._records(split))  # pylint: disable=protected-access


def test_packed_rows_unpack_to_the_examples(pairs_file, tmp_path_factory):
  """Unpacking packed rows by segment id gives back real examples (source with its own target);
  positions restart at 0 per segment; weights are 1 exactly on target tokens; until the stream
  passes the end of the first epoch, no example is placed twice."""
  task = toy_task(pairs_file, tmp_path_factory, batching="pack")
  want = set(expected_pairs(task))
  it = task.train_iterator()
  seen = []
  while it.get_state()["pos"] < len(want):
    b = next(it)
    for name in ("inputs", "targets"):
      seg, pos = b[f"{name}_segment_ids"], b[f"{name}_positions"]
      for r in range(seg.shape[0]):
        for s in range(1, seg[r].max() + 1):
          assert pos[r][seg[r] == s].tolist() == list(range((seg[r] == s).sum()))
      assert ((b[name] != 0) == (seg > 0)).all()
    np.testing.assert_array_equal(b["weights"], (b["targets_segment_ids"] > 0).astype(np.float32))
    pairs = list(zip(map(tuple, unpack(b, "inputs")), map(tuple, unpack(b, "targets"))))
    assert all(p in want for p in pairs)
    assert b["inputs_segment_ids"].max() > 1  # several examples share a row
    seen += pairs
  assert len(seen) == len(set(seen)) > len(want) * 0.8


def test_same_seed_same_batches_other_seed_other_order(pairs_file, tmp_path_factory):
  """Two iterators with one seed give identical batches; another seed gives a different order."""
  a = toy_task(pairs_file, tmp_path_factory, shuffle_seed=1).train_iterator()
  b = toy_task(pairs_file, tmp_path_factory, shuffle_seed=1).train_iterator()
  c = toy_task(pairs_file, tmp_path_factory, shuffle_seed=2).train_iterator()
  for _ in range(3):
    x, y, z = next(a), next(b), next(c)
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  assert not np.array_equal(x["inputs"], z["inputs"])


@pytest.mark.parametrize("batching", ["pack", "bucket", "pad"])
def test_state_round_trip_gives_the_identical_next_batch(pairs_file, tmp_path_factory, batching):
  """get_state after k batches (JSON round trip, as grain.checkpoint does), set_state on a fresh
  iterator: the next batches equal those of the uninterrupted iterator, across epoch ends."""
  task = toy_task(pairs_file, tmp_path_factory, batching=batching)
  it = task.train_iterator()
  for _ in range(7):
    next(it)
  state = json.loads(json.dumps(it.get_state()))
  want = [next(it) for _ in range(40)]  # 40 * 4 rows > 200 examples: crosses an epoch
  fresh = task.train_iterator()
  fresh.set_state(state)
  for w in want:
    got = next(fresh)
    assert set(got) == set(w)
    for k in w:
      np.testing.assert_array_equal(got[k], w[k])
  assert isinstance(it, grain.DatasetIterator)


def test_bucketing_shapes_and_lengths(pairs_file, tmp_path_factory):
  """Bucketed batches have the global row count, lengths from the fixed bucket set, each example
  fits its bucket (nothing cut off: every row ends with EOS) and one example per row."""
  task = toy_task(pairs_file, tmp_path_factory, batching="bucket")
  it = task.train_iterator()
  shapes = set()
  for _ in range(60):
    b = next(it)
    shapes.add(b["inputs"].shape)
    assert b["inputs"].shape[0] == 4 and b["inputs"].shape[1] in (4, 8, 16)
    assert b["inputs_segment_ids"].max() <= 1
    for row in b["targets"]:
      real = row[row != 0]
      assert len(real) == 0 or real[-1] == EOS_ID
  assert len(shapes) > 1


def test_two_hosts_cover_the_split_exactly_once(pairs_file, tmp_path_factory):
  """With 2 simulated hosts, the first epoch of each host's (pad-mode) stream and the eval batches
  together cover every example exactly once; both hosts get the same number of eval batches."""
  tasks = [toy_task(pairs_file, tmp_path_factory, index=i, count=2, batching="pad")
           for i in range(2)]
  train = []
  for t in tasks:
    n = len(t._examples("train", "drop")[0].shard(t.process_index, 2))  # pylint: disable=protected-access
    it = t.train_iterator()
    rows = []
    while len(rows) < n:
      b = next(it)
      rows += [tuple(r[r != 0]) for r in b["targets"]]
    train += rows[:n]
  want = [p[1] for p in expected_pairs(tasks[0])]
  assert sorted(train) == sorted(want)
  evals = [list(t.eval_batches("validation", batch_size=4)) for t in tasks]
  assert len(evals[0]) == len(evals[1])
  got = [tuple(r[r != 0]) for e in evals for b in e for r, w in zip(b["targets"], b["weights"])
         if w.sum() > 0]
  assert sorted(got) == sorted(p[1] for p in expected_pairs(tasks[0], "validation"))


def test_eval_batches_never_drop_and_pad_with_zero_weight(pairs_file, tmp_path_factory):
  """Over-long eval examples are truncated (EOS kept), not dropped; the last batch is padded with
  zero-weight rows; eval_examples groups every reference of a source."""
  task = toy_task(pairs_file, tmp_path_factory, max_source_len=4, max_target_len=4)
  batches = list(task.eval_batches("validation", batch_size=8))
  real = sum(int((b["weights"].sum(1) > 0).sum()) for b in batches)
  assert real == 38 and len(batches) == 5
  assert (batches[-1]["weights"][6:] == 0).all() and (batches[-1]["inputs"][6:] == 0).all()
  for b in batches:
    for row in b["inputs"]:
      assert row[row != 0][-1] == EOS_ID if row.any() else True
  refs = {e["source"]: e["references"] for e in task.eval_examples("validation")}
  first = (pairs_file / "dev.tsv").read_text().split("\t")[0]
  assert len(refs) == 37 and refs[first] == [" ".join(first.upper()), "X Y"]


def test_too_long_drop_and_truncate_are_counted(pairs_file, tmp_path_factory):
  """Training examples longer than max_*_len are dropped or truncated as configured, and counted
  against a direct count of the over-long words."""
  words = [line.split("\t")[0] for line in (pairs_file / "train.tsv").read_text().splitlines()]
  too_long = sum(len(w) + 1 > 5 for w in words)
  for mode in ("drop", "truncate"):
    task = toy_task(pairs_file, tmp_path_factory, max_source_len=5, max_target_len=16,
                    too_long=mode)
    task.train_iterator()
    counts = task.stats["train"]
    assert counts["dropped" if mode == "drop" else "truncated"] == too_long
    assert counts["examples"] == len(words) - (too_long if mode == "drop" else 0)


def test_decoder_only_layout(pairs_file, tmp_path_factory):
  """decoder_only on seq2seq: targets = source + EOS + target + EOS per segment; the prompt (source
  + EOS separator) is the prefix: prefix_mask 1 and weights 0 on it, weights 1 on target + EOS."""
  task = toy_task(pairs_file, tmp_path_factory, arch="decoder_only")
  want = {s + t: len(s) for s, t in expected_pairs(task)}
  b = next(task.train_iterator())
  assert "inputs" not in b and b["targets"].shape == (4, 32)
  for r in range(4):
    seg = b["targets_segment_ids"][r]
    for s in range(1, seg.max() + 1):
      tokens = tuple(b["targets"][r][seg == s])
      n_prompt, n_target = want[tokens], len(tokens) - want[tokens]
      assert b["prefix_mask"][r][seg == s].tolist() == [1] * n_prompt + [0] * n_target
      assert b["weights"][r][seg == s].tolist() == [0] * n_prompt + [1] * n_target
  assert task.encode_source("abc") == task.source_tokenizer.encode("abc") + [EOS_ID]


def test_decoder_only_source_and_target_ids_do_not_collide(pairs_file, tmp_path_factory):
  """decoder_only with two tokenizers (char source, symbol target) shares one embedding table, so
  the target's ordinary ids must lie after the source's: the id ranges are disjoint, the vocabulary
  covers both, and decoding the target part of a row gives back the phones."""
  task = toy_task(pairs_file, tmp_path_factory, arch="decoder_only")
  src_vocab = task.source_tokenizer.vocab_size
  assert task.target_tokenizer.vocab_size == src_vocab + task.target_tokenizer.inner.vocab_size - 4
  for source, target in task._records("train")[:50]:  # pylint: disable=protected-access
    src_ids, tgt_ids = task.source_tokenizer.encode(source), task.target_tokenizer.encode(target)
    assert all(4 <= i < src_vocab for i in src_ids)
    assert all(src_vocab <= i < task.target_tokenizer.vocab_size for i in tgt_ids)
    assert task.target_tokenizer.decode(tgt_ids + [EOS_ID]) == " ".join(target.split())
  assert task.target_tokenizer.decode([4]) == "<unk>"  # a source id is never a phone


def test_lm_rows_are_the_token_stream(tmp_path):
  """text_files LM: eval rows concatenated give the split's character ids + EOS; train rows are
  max_target_len long; weights mark the real tokens."""
  text = "".join(random.Random(1).choice("abc \n") for _ in range(500))
  (tmp_path / "t.txt").write_text(text)
  task = load_task(make_cfg(dataset="text_files", text_file=str(tmp_path / "t.txt"),
                            data_dir=str(tmp_path / "d"), arch="decoder_only", tokenizer="char",
                            max_target_len=16, batch_size=4), process_index=0, process_count=1)
  stream = np.concatenate([b["targets"].ravel() for b in task.eval_batches("validation")])
  tok = task.target_tokenizer
  np.testing.assert_array_equal(stream[stream != 0], tok.encode(text[450:]) + [EOS_ID])
  b = next(task.train_iterator())
  assert b["targets"].shape == (4, 16)
  np.testing.assert_array_equal(b["weights"], (b["targets"] != 0).astype(np.float32))
  with pytest.raises(ValueError, match="model.arch='decoder_only'"):
    load_task(make_cfg(dataset="text_files", text_file=str(tmp_path / "t.txt"),
                       data_dir=str(tmp_path / "d"), tokenizer="char"),
              process_index=0, process_count=1)


def test_workdir_tokenizers_are_reused(pairs_file, tmp_path_factory, tmp_path):
  """A workdir's saved tokenizers win over the data's: eval decodes with the training vocabulary."""
  task = toy_task(pairs_file, tmp_path_factory, workdir=str(tmp_path))
  marker = pipeline.Examples  # noqa: F841  (module import is used by other tests)
  from transformer.data import tokenizers  # pylint: disable=g-import-not-at-top
  tokenizers.CharTokenizer(list("zyx")).save(str(tmp_path / "tokenizers" / "source"))
  again = toy_task(pairs_file, tmp_path_factory, workdir=str(tmp_path))
  assert again.source_tokenizer.units == ["z", "y", "x"]
  assert again.target_tokenizer == task.target_tokenizer
  assert "tensorflow" not in sys.modules


def _naive_first_fit(lens, rows, caps, max_skipped):
  """The reference: each example into the lowest-numbered row with room in every feature."""
  free = [caps.copy() for _ in range(rows)]
  count = [0] * rows
  placed, skipped, n = [], [], 0
  for n, ls in enumerate(lens, 1):
    r = next((r for r in range(rows) if (free[r] >= ls).all()), None)
    if r is None:
      skipped.append(n - 1)
      if len(skipped) >= max_skipped:
        break
      continue
    count[r] += 1
    placed.append((n - 1, r, tuple(int(x) for x in caps - free[r]), count[r]))
    free[r] = free[r] - ls
  return max(n, 1), placed, skipped


@pytest.mark.parametrize("rows, num, features, max_skipped", [
    (3, 40, 2, 5),      # stops at the 5th skip
    (5, 400, 2, 1000),  # the candidates run out; more than one chunk of 4 x rows lists
    (8, 300, 3, 7),     # three features
    (2, 10, 1, 3),      # one feature
])
def test_first_fit_against_naive_reference(rows, num, features, max_skipped):
  """first_fit places each example into the lowest-numbered row with room in every feature, at
  the offset of the lengths already there, with segment ids 1, 2, ... in each row, skipping (and
  recording) examples that fit nowhere, like a naive loop; examined counts agree."""
  rng = np.random.default_rng(rows * num)
  caps = rng.integers(8, 14, size=features)
  lens = rng.integers(1, 7, size=(num, features))
  n, placed, row, off, seg, skipped = pipeline.first_fit(lens, rows, caps, max_skipped)
  ref_n, ref_placed, ref_skipped = _naive_first_fit(lens, rows, caps, max_skipped)
  assert n == ref_n and skipped == ref_skipped
  assert [(int(i), int(r), tuple(int(x) for x in o), int(s))
          for i, r, o, s in zip(placed, row, off, seg)] == ref_placed
  assert off.dtype == np.int64 and seg.dtype == np.int32 and off.shape == (len(placed), features)


def test_first_fit_with_nothing_placed():
  """No example fits any row: every one is skipped, and the placement arrays are empty, shaped."""
  n, placed, row, off, seg, skipped = pipeline.first_fit(np.full((4, 2), 9), 3, np.array([5, 5]),
                                                         max_skipped=10)
  assert n == 4 and skipped == [0, 1, 2, 3]
  assert placed.shape == row.shape == seg.shape == (0,) and off.shape == (0, 2)
