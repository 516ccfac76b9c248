"""The reliability campaign of benchmarks/adversarial.py: how it reads an outcome, its counts."""

import os
import subprocess
import sys

from record_schema import OPTIONAL, REQUIRED

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import adversarial  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position


def _proc(rc, stderr="", stdout=""):
  return subprocess.CompletedProcess([], rc, stdout, stderr)


def test_classify_reads_each_outcome(tmp_path):
  """hang, loss, traceback, silent corruption, clear error (naming the culprit), unclear error
  and ok (by the case's check) are told apart, in that order of precedence."""
  ctx = adversarial.Context(str(tmp_path), "", "", "")
  err = adversarial.Case("e", "x", "clear error", lambda c: [], culprit="data.train_file")
  ok = adversarial.Case("o", "x", "ok", lambda c: [], check=lambda c, p: "done" in p.stdout)
  named = _proc(1, "W some warning\nerror: data.train_file='x' is a FIFO\n")
  assert adversarial.classify(err, ctx, [None], [])[0] == "hang"
  assert adversarial.classify(err, ctx, [named], [str(tmp_path / "f")])[0] == "loss"
  assert adversarial.classify(err, ctx, [_proc(1, "Traceback (most recent call last):\n  x\n"
                                               "error: data.train_file")], [])[0] == "traceback"
  assert adversarial.classify(err, ctx, [_proc(0)], [])[0] == "silent corruption"
  assert adversarial.classify(err, ctx, [named], []) == (
      "clear error", "error: data.train_file='x' is a FIFO")
  assert adversarial.classify(err, ctx, [_proc(1, "error: something")], [])[0] == "unclear error"
  assert adversarial.classify(ok, ctx, [_proc(0, stdout="done")], [])[0] == "ok"
  assert adversarial.classify(ok, ctx, [_proc(0, stdout="?")], [])[0] == "silent corruption"
  two = [_proc(0), _proc(1, "error: data.train_file is locked")]  # concurrent writers: one refused
  assert adversarial.classify(err, ctx, two, [])[0] == "clear error"


def test_lost_sees_deleted_and_rewritten_files_not_appends(tmp_path):
  (tmp_path / "run").mkdir()
  for name in ("kept", "appended", "rewritten", "deleted", "allowed"):
    (tmp_path / "run" / name).write_text("abc")
  before = adversarial._snapshot(str(tmp_path))  # pylint: disable=protected-access
  (tmp_path / "run" / "appended").write_text("abcdef")
  (tmp_path / "run" / "rewritten").write_text("xbc")
  (tmp_path / "run" / "allowed").write_text("new")
  (tmp_path / "run" / "deleted").unlink()
  lost = adversarial._lost(before, str(tmp_path), ("run/allowed",))  # pylint: disable=protected-access
  assert sorted(os.path.basename(p) for p in lost) == ["deleted", "rewritten"]


def test_counts_table_and_record_cover_every_case():
  """Every case has a unique name and a known expected outcome; counts, the table and the record
  carry every row."""
  names = [c.name for c in adversarial.CASES]
  assert len(names) == len(set(names)) >= 47
  assert {c.expect for c in adversarial.CASES} <= {"ok", "clear error"}
  assert all(c.culprit for c in adversarial.CASES if c.expect == "clear error")
  rows = [{"case": "a", "item": "x", "expected": "ok", "observed": "ok", "detail": "", "seconds": 1},
          {"case": "b", "item": "x", "expected": "clear error", "observed": "hang",
           "detail": "no exit | in 5 s", "seconds": 5}]
  c = adversarial.counts(rows)
  assert (c["ok"], c["hang"], c["as_expected"], c["cases"]) == (1, 1, 1, 2)
  assert "| b | x | clear error | hang **(!)** | no exit \\| in 5 s |" in adversarial.table(rows)
  rec = adversarial.record(rows, "python benchmarks/adversarial.py --record", 12.3,
                           {"git_sha": "abc", "git_dirty": False, "packages": {"jax": "0"}})
  assert rec["name"] == "adversarial_campaign" and rec["commit"] == "abc"
  assert rec["metrics"]["silent_corruption"] == 0 and rec["metrics"]["as_expected"] == 1
  assert rec["wall_clock_s"] == 12.3
  assert set(REQUIRED) <= set(rec) <= set(REQUIRED) | set(OPTIONAL)  # the records' schema
