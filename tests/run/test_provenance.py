"""provenance.json's data fingerprint holds the records-cache digest of every split the run read
(training's train and eval splits; a split first evaluated later is added), and evaluation refuses
a split whose cache was edited together with its digest file."""

import glob
import hashlib
import json
import os
import re
import shutil

import pytest

import g2p_mini
from transformer.infer import evaluation
from transformer.run import provenance


def _edit_cache_and_its_digest(data_dir, split):
  """Swaps two pronunciations in `split`'s records cache and rewrites its digest file to match,
  so that the cache's own check passes; returns the cache's path."""
  (cache,) = glob.glob(os.path.join(data_dir, "**", "cache", f"{split}-*.json"), recursive=True)
  records = json.load(open(cache))
  records[0][1], records[1][1] = records[1][1], records[0][1]
  data = json.dumps(records, ensure_ascii=False).encode("utf-8")
  with open(cache, "wb") as f:
    f.write(data)
  directory, name = os.path.split(cache)
  with open(os.path.join(directory, f".{name}.sha256"), "w") as f:
    f.write(hashlib.sha256(data).hexdigest())
  return cache


@pytest.fixture
def run_copy(tmp_path_factory, tmp_path):
  """A copy of the trained mini G2P run and of its prepared data, and eval overrides reading it."""
  trained = g2p_mini.trained_run(tmp_path_factory)
  data = str(tmp_path / "data")
  shutil.copytree(os.path.join(os.path.dirname(trained), "data"), data)
  workdir = str(tmp_path / "run")
  shutil.copytree(trained, workdir)
  return workdir, os.path.join(data, "tfds"), {"data.data_dir": os.path.join(data, "tfds"),
                                               "eval.num_decode_examples": 4}


def _recorded(workdir):
  with open(os.path.join(workdir, "provenance.json")) as f:
    return json.load(f)["data"]["splits"]


def test_training_records_the_cache_of_the_train_and_eval_splits(run_copy):
  """The run read train and validation: both caches' digests are in provenance.json."""
  workdir, _, _ = run_copy
  splits = _recorded(workdir)
  assert splits["train"]["cache_sha256"] and splits["validation"]["cache_sha256"]


def test_an_edited_eval_split_cache_with_its_digest_is_refused(run_copy):
  """The validation cache edited together with its digest file: evaluation stops with one line
  naming the split, the file and both digests."""
  workdir, data_dir, overrides = run_copy
  recorded = _recorded(workdir)["validation"]["cache_sha256"]
  cache = _edit_cache_and_its_digest(data_dir, "validation")
  with pytest.raises(provenance.DataMismatchError) as info:
    evaluation.evaluate_split(workdir, split="validation", verbose=False, overrides=overrides)
  message = str(info.value)
  assert "\n" not in message and "split 'validation'" in message and cache in message, message
  assert recorded[os.path.basename(cache)] in message
  assert not os.path.exists(os.path.join(workdir, evaluation.result_files("validation")[0]))


def test_a_split_first_evaluated_later_is_recorded_then_checked(run_copy):
  """The test split, never read by training, is recorded by its first evaluation (its records
  are the run's); its cache edited afterwards with its digest file is then refused."""
  workdir, data_dir, overrides = run_copy
  path = os.path.join(workdir, "provenance.json")
  with open(path) as f:  # as training left it (another test may have evaluated the shared run)
    record = json.load(f)
  record["data"]["splits"]["test"].pop("cache_sha256", None)
  with open(path, "w") as f:
    json.dump(record, f)
  assert not _recorded(workdir)["test"].get("cache_sha256")
  evaluation.evaluate_split(workdir, split="test", verbose=False, overrides=overrides)
  assert _recorded(workdir)["test"]["cache_sha256"]
  cache = _edit_cache_and_its_digest(data_dir, "test")
  with pytest.raises(provenance.DataMismatchError,
                     match="split 'test'.*" + re.escape(os.path.basename(cache))):
    evaluation.evaluate_split(workdir, split="test", verbose=False, overrides=overrides)


def test_a_resumed_run_keeps_the_recorded_cache_digests_and_refuses_an_edited_cache(tmp_path):
  """A resumed run's new fingerprint keeps the cache digests provenance.json recorded (the test
  split an evaluation recorded stays recorded); a cache of the same records whose bytes changed is
  refused in one line; a split whose records changed takes its new digests."""
  records = {"files": 1, "bytes": 10, "records": 5, "records_sha256": "ab" * 32}
  old = {"dataset": "d/c", "version": "1.1.0", "dir": "/data", "splits": {
      "train": records | {"cache_sha256": {"train-x-5.json": "11"}},
      "test": records | {"cache_sha256": {"test-x-5.json": "22"}}}}
  path = tmp_path / "provenance.json"
  path.write_text(json.dumps({"data": old}))
  new = old | {"splits": {"train": records | {"cache_sha256": {"train-x-5.json": "11"}},
                          "test": records}}
  assert provenance.carried_over(str(path), new) == old
  edited = old | {"splits": {"train": records | {"cache_sha256": {"train-x-5.json": "33"}}}}
  with pytest.raises(provenance.DataMismatchError) as info:
    provenance.carried_over(str(path), edited)
  assert "split 'train'" in str(info.value) and "/data/cache/train-x-5.json" in str(info.value)
  assert "has sha256 33, not the 11 recorded in" in str(info.value)
  other = records | {"records_sha256": "cd" * 32, "cache_sha256": {"train-x-5.json": "44"}}
  assert provenance.carried_over(str(path), old | {"splits": {"train": other}}) == (
      old | {"splits": {"train": other}})
  assert provenance.carried_over(str(tmp_path / "none.json"), new) == new


def _fingerprint(train_sha):
  split = lambda sha: {"files": 1, "bytes": 100, "records": 10, "records_sha256": sha}  # noqa: E731
  return {"dataset": "text_files/f1", "version": "1.1.0", "dir": "/data/text_files/f1/1.1.0",
          "splits": {"train": split(train_sha), "validation": split("dev"), "test": split("t")}}


def test_a_resume_refuses_a_training_split_whose_records_changed(tmp_path):
  """A data file edited between a run and its resume (other records in data.train_split or
  data.eval_split) is refused in one line naming the config's data file and both digests, before
  anything in the workdir changes; a fresh start, or another split (test), is not refused."""
  from transformer.run import reporting  # pylint: disable=g-import-not-at-top  (JAX)
  config = {"data": {"dataset": "text_files", "text_file": "/corpus.txt", "train_split": "train",
                     "eval_split": "validation"}}
  workdir = str(tmp_path)
  reporting.Reporter(workdir, config, start_step=0, show_progress=False,
                     data=_fingerprint("aaaa")).close()
  before = {n: (tmp_path / n).read_bytes() for n in ("provenance.json", "config.json")}
  with pytest.raises(provenance.DataMismatchError) as err:
    reporting.Reporter(workdir, config, start_step=10, show_progress=False,
                       data=_fingerprint("bbbb"))
  message = str(err.value)
  assert "\n" not in message and message.startswith(
      f"data.text_file='/corpus.txt' changed since the run in {workdir} read it: its 'train' "
      "split now holds 10 records, records sha256 bbbb, the run's 10 records, records sha256 aaaa")
  assert {n: (tmp_path / n).read_bytes() for n in before} == before
  other_test = _fingerprint("aaaa")
  other_test["splits"]["test"]["records_sha256"] = "changed"
  reporting.Reporter(workdir, config, start_step=10, show_progress=False, data=other_test).close()
  reporting.Reporter(workdir, config, start_step=0, show_progress=False,
                     data=_fingerprint("bbbb")).close()


def test_a_resume_on_an_edited_training_file_is_refused_and_the_run_left_as_it_was(run_copy,
                                                                                  tmp_path):
  """Training further a finished run whose training file was edited since (a word added): one
  DataMismatchError naming data.train_file, the run's files as they were (train_done.json kept:
  the run is still finished at its checkpoint)."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from transformer.train import loop  # pylint: disable=g-import-not-at-top
  workdir, data_dir, _ = run_copy
  with open(os.path.join(workdir, "config.json")) as f:
    cd = ml_collections.ConfigDict(json.load(f))
  edited = str(tmp_path / "train.tsv")
  shutil.copy(cd.data.train_file, edited)
  with open(edited, "a", encoding="utf-8") as f:
    f.write("zyzzyva\tZ IH1 Z IY0 V AH0\n")
  cd.data.update(train_file=edited, data_dir=data_dir)
  cd.train.num_steps += 10
  before = {n: open(os.path.join(workdir, n), "rb").read()
            for n in ("train_done.json", "metrics.jsonl", "provenance.json")}
  with pytest.raises(provenance.DataMismatchError, match=rf"^data.train_file='{edited}' changed "
                     r"since the run in .* read it: its 'train' split now holds \d+ records"):
    loop.train_and_evaluate(cd, workdir)
  assert {n: open(os.path.join(workdir, n), "rb").read() for n in before} == before
