"""Tests for transformer/files.py: workdir file helpers on local paths and on a fake gs:// bucket."""

import importlib
import importlib.util
import json
import os

from fsspec.implementations.memory import MemoryFileSystem
import pytest

from transformer import files


class _FakeGCS(MemoryFileSystem):
  """An in-memory stand-in for gcsfs (no network); records every path opened for writing."""
  protocol = ("gs", "gcs")
  store: dict = {}
  pseudo_dirs: list = [""]
  written: list = []

  def _open(self, path, mode="rb", **kwargs):
    if "w" in mode or "a" in mode:
      _FakeGCS.written.append((path, mode))
    return super()._open(path, mode, **kwargs)


@pytest.fixture
def bucket(monkeypatch):
  """gs:// paths served by _FakeGCS through the real epath -> fsspec route (gcsfs's slot)."""
  from etils.epath import backend  # pylint: disable=g-import-not-at-top
  registry = importlib.import_module("fsspec.registry")._registry  # pylint: disable=protected-access
  for name in ("gs", "gcs"):
    monkeypatch.setitem(registry, name, _FakeGCS)
  backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
  _FakeGCS.clear_instance_cache()
  monkeypatch.setattr(_FakeGCS, "store", {})
  monkeypatch.setattr(_FakeGCS, "pseudo_dirs", [""])
  monkeypatch.setattr(_FakeGCS, "written", [])
  yield "gs://bucket/runs/a"
  backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access


def test_local_atomic_write_replaces_whole_file_and_leaves_no_temporary(tmp_path):
  """write_text_atomic on a local path gives exactly the new text, no stray temp file, and a
  reader holding the old file keeps the old content (rename, not an in-place rewrite)."""
  path = tmp_path / "config.json"
  files.write_text_atomic(path, "old")
  with open(path, encoding="utf-8") as reader:
    files.write_text_atomic(path, "new é")
    assert reader.read() == "old"  # the old inode is untouched
  assert path.read_text(encoding="utf-8") == "new é"
  assert os.listdir(tmp_path) == ["config.json"]
  files.write_bytes_atomic(tmp_path / "m.model", b"\x00\xff")
  assert files.read_bytes(tmp_path / "m.model") == b"\x00\xff"


def test_local_append_read_exists_makedirs_remove(tmp_path):
  """append_line creates then appends (same bytes as open(..., 'a')); the other helpers agree
  with os.path on the same files."""
  d = tmp_path / "a" / "b"
  assert not files.exists(d) and not files.isdir(d)
  files.makedirs(d)
  files.makedirs(d)  # idempotent
  assert files.isdir(d) and os.path.isdir(d)
  path = os.path.join(d, "metrics.jsonl")
  files.append_line(path, json.dumps({"step": 1}))
  files.append_line(path, json.dumps({"step": 2}))
  with open(path, encoding="utf-8") as f:
    assert f.read() == '{"step": 1}\n{"step": 2}\n'
  assert files.read_text(path) == '{"step": 1}\n{"step": 2}\n'
  assert files.listdir(d) == ["metrics.jsonl"]
  files.remove(path)
  assert not files.exists(path) and not os.path.exists(path)
  assert files.is_local(path) and files.is_local("runs/x") and not files.is_local("gs://b/x")


def test_bucket_paths_go_through_epath_and_write_objects_directly(bucket):
  """On a gs:// path the same helpers reach the (fake) bucket file system: the atomic write is one
  direct object write (no temporary object, no rename), appends rewrite the object, reads and
  existence checks see it; nothing lands on the local disk."""
  files.makedirs(bucket)
  path = bucket + "/config.json"
  files.write_text_atomic(path, '{"a": 1}')
  assert files.read_text(path) == '{"a": 1}'
  assert [p for p, _ in _FakeGCS.written] == ["gs://bucket/runs/a/config.json"]
  files.write_bytes_atomic(bucket + "/spm.model", b"\x00\xff")
  assert files.read_bytes(bucket + "/spm.model") == b"\x00\xff"
  jsonl = bucket + "/metrics.jsonl"
  files.append_line(jsonl, "1")
  files.append_line(jsonl, "2")
  assert files.read_text(jsonl) == "1\n2\n"
  assert all("a" not in mode for _, mode in _FakeGCS.written)  # never an object append
  assert files.exists(jsonl) and files.isdir(bucket) and not files.exists(bucket + "/nope")
  assert files.listdir(bucket) == ["config.json", "metrics.jsonl", "spm.model"]
  files.remove(jsonl)
  assert not files.exists(jsonl)
  assert not os.path.exists("gs:") and not os.path.exists("gs://bucket")


def test_tokenizer_round_trip_on_a_bucket(bucket):
  """Tokenizers save to and load from a gs:// workdir through the helpers (encode agrees)."""
  from transformer.data import tokenizers  # pylint: disable=g-import-not-at-top
  tok = tokenizers.build("char", ["hello", "world"])
  tok.save(bucket + "/tokenizers/target")
  loaded = tokenizers.load(bucket + "/tokenizers/target")
  assert loaded.encode("hello") == tok.encode("hello")


def test_missing_backend_is_a_clear_error(monkeypatch):
  """Without gcsfs (and without the fake), a gs:// path fails naming the missing package."""
  if importlib.util.find_spec("gcsfs") is not None:
    pytest.skip("a gs:// backend is installed")
  from etils.epath import backend  # pylint: disable=g-import-not-at-top
  backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
  with pytest.raises(ImportError, match="gcsfs"):
    files.read_text("gs://bucket/x/config.json")


def test_run_files_on_a_bucket(bucket):
  """train_done.json written by training is read back by the sweep runner, and a config.json in
  the bucket is what checkpoints.check_compatible compares against (no local file involved)."""
  from transformer.run import checkpoints  # pylint: disable=g-import-not-at-top
  from transformer.sweeps import runner
  from transformer.train import loop
  loop.write_done_marker(bucket, 7, "num_steps", {"eval/loss": 1.5}, 2.0)
  done = runner.read_json(bucket + "/" + loop.DONE_FILE)
  assert done == {"step": 7, "reason": "num_steps", "wall_seconds": 2.0,
                  "metrics": {"eval/loss": 1.5}}
  files.write_text_atomic(bucket + "/config.json", json.dumps({"model": {"d_model": 8}}))
  assert checkpoints._saved_config(bucket) == (  # pylint: disable=protected-access
      {"model": {"d_model": 8}}, bucket + "/config.json")
