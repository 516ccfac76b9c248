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
  in_path = _proc(1, f"error: diverged at step 2 in {tmp_path}/new")  # the case's dir, not a key
  assert adversarial.classify(
      adversarial.Case("e", "x", "clear error", lambda c: [], culprit=tmp_path.name), ctx,
      [in_path], [])[0] == "unclear error"
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


def test_concurrent_loser_may_refuse_clearly_and_checks_hold_for_refusals(tmp_path):
  """Concurrent commands expected ok: one refusing with a line naming the culprit is fine, one
  failing otherwise is not the ok expected; a refusal whose check fails (e.g. a half-written step
  left behind) is not a clear error."""
  ctx = adversarial.Context(str(tmp_path), "", "", "")
  ok = adversarial.Case("o", "x", "ok", lambda c: [], culprit="tfds_fresh")
  loser = _proc(1, "error: tfds_fresh is being prepared by another process")
  assert adversarial.classify(ok, ctx, [_proc(0), loser], [])[0] == "ok"
  assert adversarial.classify(ok, ctx, [_proc(0), _proc(1, "error: rename failed")],
                              [])[0] == "clear error"
  assert adversarial.classify(ok, ctx, [loser, loser], [])[0] == "clear error"  # none succeeded
  err = adversarial.Case("e", "x", "clear error", lambda c: [], culprit="30",
                         check=lambda c, p: "None" not in p.stderr)
  assert adversarial.classify(err, ctx, [_proc(1, "error: step 30")], [])[0] == "clear error"
  assert adversarial.classify(err, ctx, [_proc(1, "error: step 30, step None")],
                              [])[0] == "silent corruption"


def _fake_run(tmp_path):
  """A Context whose run has step directories 30 and 60 (each with a digest.json), a
  metrics.jsonl and a records cache with its digest in its data."""
  ctx = adversarial.Context(str(tmp_path / "case"), "", str(tmp_path / "data"), "")
  for step in (30, 60):
    os.makedirs(os.path.join(ctx.run, "checkpoints", str(step)))
    open(os.path.join(ctx.run, "checkpoints", str(step), "digest.json"), "w").close()
  with open(os.path.join(ctx.run, "metrics.jsonl"), "w") as f:
    f.writelines(f'{{"step": {s}, "train/loss": 1.0}}\n' for s in (10, 20, 30, 40, 50, 60))
  open(os.path.join(ctx.run, "train_done.json"), "w").close()
  cache = tmp_path / "data" / "tfds" / "pairs" / "1.0" / "cache"
  cache.mkdir(parents=True)
  (cache / "validation-source+target-3.json").write_text('[["cat", "K AE T"], ["dog", "D AO G"]]')
  return ctx


def test_setups_stage_what_they_name(tmp_path):
  """The symlinked step is a link to the moved step; the cache and its digest agree after the
  edit (only the run's provenance can tell); the metrics row is cut half way; the renamed step
  is at 90."""
  from transformer.data import task  # pylint: disable=g-import-not-at-top
  ctx = _fake_run(tmp_path)
  argv = adversarial.symlinked_old_step(ctx)
  step_30 = os.path.join(ctx.run, "checkpoints", "30")
  assert os.path.islink(step_30) and os.path.exists(os.path.join(step_30, "digest.json"))
  assert "--config.checkpoint.every_steps=10" in argv
  assert adversarial._no_half_written_step(ctx, None)  # pylint: disable=protected-access
  os.makedirs(os.path.join(ctx.run, "checkpoints", "70"))  # no digest: half written
  assert not adversarial._no_half_written_step(ctx, None)  # pylint: disable=protected-access

  argv = adversarial.cache_edited_with_sidecar(ctx)
  edited = os.path.join(ctx.dir, "tfds", "pairs", "1.0", "cache", "validation-source+target-3.json")
  assert task.read_cache(edited) == [("cat", "D AO G"), ("dog", "K AE T")]
  assert f"--config.data.data_dir={ctx.dir}/tfds" in argv

  ctx = _fake_run(tmp_path / "again")
  adversarial.metrics_row_cut_short(ctx)
  with open(os.path.join(ctx.run, "metrics.jsonl")) as f:
    lines = f.read().split("\n")
  assert len(lines) == 4 and lines[3].startswith('{"step": 40') and not lines[3].endswith("}")
  assert not os.path.exists(os.path.join(ctx.run, "checkpoints", "60"))

  ctx = _fake_run(tmp_path / "renamed")
  adversarial.renamed_step_eval(ctx)
  assert sorted(os.listdir(os.path.join(ctx.run, "checkpoints"))) == ["30", "90"]


def test_read_only_after_remounts_once_the_path_exists(tmp_path):
  """A case with read_only_after runs its command writable and remounts its paths read-only
  when the trigger appears (the command's exit status is the shell's)."""
  ctx = adversarial.Context(str(tmp_path), "", "", "")
  case = adversarial.Case("r", "x", "clear error", lambda c: [], "checkpoints",
                          read_only=("run/checkpoints",),
                          read_only_after="run/checkpoints/80/digest.json")
  argv = adversarial._command(case, ctx, ["python", "train.py"])  # pylint: disable=protected-access
  script = argv[-1]
  assert argv[:3] == ["unshare", "-m", "sh"]
  assert script.index("mount --bind") < script.index("python train.py &")
  remount = script.index("remount,bind,ro")
  assert script.index("80/digest.json") < remount < script.index("wait $pid")
