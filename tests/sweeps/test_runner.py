"""The sweep runner with a fake trainer (parallel, failure, rerun skips, a process that cannot
start, SIGTERM and resume) and the report of its points."""

import csv
import dataclasses
import json
import os
import shutil
import threading

import pytest

from sweep_fixtures import TINY, fake, recording, sweep_cli  # noqa: F401  (fake: a fixture)
from transformer.sweeps import report, runner, spec


def test_runner_parallel_failure_rerun_skips_and_resumes(fake):
  """parallel=2 overlaps two training processes; a failing point is reported (exit code and
  command in its record and log) while the others finish; the rerun starts only that point's
  train and eval; a third run starts no process at all. Trained means train_done.json at
  num_steps or after an early stop: a point without it or with a marker at a smaller step (a run
  to be trained further) is 'resume' (train again, training continues from its checkpoint), and
  when that train finds the step already evaluated, eval is not run again; a trained but not
  evaluated point only gets eval; a trainer that exits 0 short of num_steps (SIGTERM) counts as
  unfinished and its eval is not started."""
  points, commands = fake
  os.makedirs(points[2].workdir)
  open(os.path.join(points[2].workdir, "FAIL_ONCE"), "w").close()
  calls, lines = [], []
  failed = runner.run(points, commands, parallel=2, launch=recording(calls), echo=lines.append)
  assert [p.name for p in failed] == ["lr=2.0"]
  assert [runner.status(p, commands) for p in points] == ["done", "done", "new"]
  spans = [json.load(open(os.path.join(p.workdir, "span.json"))) for p in points[:2]]
  assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]  # they overlapped
  record = runner.read_record(points[2])
  assert record["attempts"][-1]["returncode"] == 3 and "train_seconds" in record
  assert "$ " + " ".join(record["attempts"][-1]["argv"]) in open(
      os.path.join(points[2].workdir, runner.LOG)).read()
  calls.clear()
  assert runner.run(points, commands, launch=recording(calls), echo=lines.append) == []
  assert calls == [commands.train(points[2]), commands.eval(points[2])]
  calls.clear()
  assert runner.run(points, commands, launch=recording(calls), echo=lines.append) == []
  assert calls == [] and lines[-3:] == [f"[{i + 1}/3] {p.name}: done (skipped)"
                                        for i, p in enumerate(points)]
  os.remove(os.path.join(points[0].workdir, "metrics.test.json"))
  assert runner.pending_commands(points[0], commands) == [("eval", commands.eval(points[0]))]
  done = os.path.join(points[1].workdir, "train_done.json")
  with open(done, "w") as f:
    json.dump({"step": 2, "reason": "num_steps"}, f)
  assert runner.status(points[1], commands) == "resume"
  with open(done, "w") as f:
    json.dump({"step": 2, "reason": "early_stop"}, f)
  assert runner.status(points[1], commands) == "eval"  # metrics.test.json is of step 3
  os.remove(done)
  assert runner.status(points[1], commands) == "resume"
  assert [s for s, _ in runner.pending_commands(points[1], commands)] == ["train", "eval"]
  calls.clear()
  assert runner.run(points[1:2], commands, launch=recording(calls), echo=lines.append) == []
  assert calls == [commands.train(points[1])]  # its marker says 3, evaluated at 3: no eval
  shutil.rmtree(os.path.join(points[2].workdir, "checkpoints"))
  os.remove(os.path.join(points[2].workdir, "train_done.json"))
  open(os.path.join(points[2].workdir, "PREEMPT_ONCE"), "w").close()
  calls.clear()
  assert runner.run(points[2:], commands, launch=recording(calls), echo=lines.append) == [
      points[2]]
  assert calls == [commands.train(points[2])]  # no eval of an unfinished run
  assert runner.read_record(points[2])["attempts"][-1]["returncode"] == (
      "stopped before train.num_steps")


def test_report_lists_every_point_with_its_metrics(fake, tmp_path):
  """results.csv has one row per point with the swept value, steps, the last dev evaluation, the
  test metrics, the median tokens/s of the logged windows after the first, the measured wall
  time and status (done also without checkpoints, by the logged steps); results.md states the
  columns the same for every point once above its table and bolds the best (lowest) test/wer;
  both PNGs are written."""
  points, commands = fake
  assert runner.run(points, commands, parallel=2, echo=lambda _: None) == []
  out = report.write_report(points, str(tmp_path / "w"), title="t")
  assert out["metric"] == "test/wer"
  with open(out["csv"]) as f:
    rows = list(csv.DictReader(f))
  assert [r["point"] for r in rows] == ["lr=0.5", "lr=1.0", "lr=2.0"]
  for r, lr in zip(rows, (0.5, 1.0, 2.0)):
    assert r["lr"] == str(lr) and r["steps"] == "3" and r["status"] == "done"
    assert float(r["dev/loss"]) == lr and float(r["dev/wer"]) == pytest.approx(lr / 10)
    assert float(r["test/loss"]) == 2 * lr and float(r["test/wer"]) == pytest.approx(lr / 5)
    assert float(r["tokens_per_sec"]) == 250.0  # median of 200, 300 (100 is the compile window)
    assert float(r["wall_seconds"]) >= 0.5
  shutil.rmtree(os.path.join(points[0].workdir, "checkpoints"))  # as collected from a bucket
  assert report.collect(points)[0]["status"] == "done"
  md = open(out["md"]).read()
  assert md.startswith("t\n\nSame for every point: tokens_per_sec 250, wall_seconds 1 s.\n\n"
                       "| point | lr | params | steps | dev/loss | dev/wer | test/loss | test/wer |")
  assert "| **0.1** |" in md and md.count("**") == 2
  for key in ("plot", "curves"):
    with open(out[key], "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_process_that_cannot_start_fails_its_point_only(fake):
  """A missing interpreter is each point's own failure (exit 127, reason in its sweep.log), not an
  exception that ends the sweep: every point is tried and returned as failed."""
  points, commands = fake
  broken = spec.Commands(**{**commands.__dict__, "python": "/nonexistent/python"})
  assert runner.run(points[:2], broken, echo=lambda _: None) == points[:2]
  assert runner.read_record(points[0])["attempts"][-1]["returncode"] == 127
  assert "cannot start /nonexistent/python" in open(
      os.path.join(points[0].workdir, runner.LOG)).read()


WAIT_FOR_SIGTERM = """
import os, signal, sys, time
w = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))["workdir"]
os.makedirs(w, exist_ok=True)
def stop(*_):
  os.makedirs(os.path.join(w, "checkpoints", "1"))  # the checkpoint a preempted run saves
  open(os.path.join(w, "checkpoints", "1", "commit_success.txt"), "w").close()
  sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(os.path.join(w, "started"), "w").close()
time.sleep(60)
"""


def test_stop_running_sends_sigterm_so_points_checkpoint_and_resume(fake, tmp_path):
  """stop_running() (what SIGTERM to sweep.py calls; Ctrl-C passes SIGINT the same way) sends
  SIGTERM to the running trainer, which checkpoints and exits 0; the runner records that point as
  stopped short of num_steps (no eval), and its state is then 'resume'."""
  points, commands = fake
  (tmp_path / "wait.py").write_text(WAIT_FOR_SIGTERM)
  waiting = spec.Commands(**{**commands.__dict__, "train_script": str(tmp_path / "wait.py")})
  result = []
  thread = threading.Thread(target=lambda: result.append(
      runner.run(points[:1], waiting, echo=lambda _: None)))
  thread.start()
  started = os.path.join(points[0].workdir, "started")
  for _ in range(200):
    if os.path.exists(started):
      break
    thread.join(0.05)
  runner.stop_running()
  thread.join(30)
  assert result == [[points[0]]]
  attempts = runner.read_record(points[0])["attempts"]
  assert [(a["stage"], a["returncode"]) for a in attempts] == [
      ("train", "stopped before train.num_steps")]
  assert runner.status(points[0], commands) == "resume"


def test_a_rerun_with_other_sweep_wide_overrides_is_refused_not_relabelled(fake, tmp_path):
  """Points are keyed by their complete overrides: after a sweep ran with train.num_steps=3, a
  rerun with another sweep-wide value (or config) is one SweepError line naming the point and the
  key, starts nothing and rewrites no record; so is sweep.py's dry run. A record of the format
  before `run` existed is refused in one line."""
  points, commands = fake
  assert runner.run(points, commands, echo=lambda _: None) == []
  records = [runner.read_record(p) for p in points]
  assert records[0]["run"] == {"config": TINY, "overrides": {"train.num_steps": 3,
                                                             "train.learning_rate": 0.5}}
  changed = dataclasses.replace(commands, base_overrides={"train.num_steps": 3,
                                                          "model.dropout_rate": 0.2})
  calls = []
  with pytest.raises(spec.SweepError, match=r"lr=0.5 run with no --config.model.dropout_rate "
                     r"\(now --config.model.dropout_rate=0.2\); its results are not this sweep's"):
    runner.run(points, changed, launch=recording(calls), echo=lambda _: None)
  assert calls == [] and [runner.read_record(p) for p in points] == records
  other = dataclasses.replace(commands, config_arg="configs/g2p.py:fast")
  with pytest.raises(spec.SweepError, match=r"--config=configs/g2p.py:tiny \(now "):
    runner.check_same_runs(points, other)
  runner.write_manifest(points, commands, "s.py", str(tmp_path / "w"))
  out = sweep_cli(f"--config={TINY}", f"--sweep={tmp_path / 's.py'}", f"--workdir={tmp_path / 'w'}",
                  "--dry_run", "--config.train.num_steps=4")
  assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
  assert out.stderr.strip().splitlines()[-1].startswith("error: ") and (
      "its results are not this sweep's" in out.stderr), out.stderr[-2000:]
  for p in points:
    record = runner.read_record(p)
    del record["run"]
    runner.write_record(p, record)
  with pytest.raises(spec.SweepError, match=r"sweep_point.json records no run \(an older sweep "):
    runner.check_same_runs(points, commands)


def test_a_point_workdir_holding_a_run_no_sweep_started_is_checked_against_the_point(fake,
                                                                                     tmp_path):
  """A point's directory holding a run without the sweep's record (a run copied or trained
  there by hand) is refused when its config.json holds another value of the point's overrides,
  never reported as the point's result; one holding the same values (results copied back from
  a bucket) is read as the point's."""
  points, commands = fake
  os.makedirs(points[0].workdir)
  with open(os.path.join(points[0].workdir, "config.json"), "w") as f:
    json.dump({"train": {"learning_rate": 0.005, "num_steps": 3}}, f)
  with pytest.raises(spec.SweepError, match=r"holds a run that no sweep started, of "
                     r"train.learning_rate=0.005 \(point lr=0.5: 0.5\)"):
    runner.check_same_runs(points, commands)
  with open(os.path.join(points[0].workdir, "config.json"), "w") as f:
    json.dump({"train": {"learning_rate": 0.5, "num_steps": 3.0}, "model": {}}, f)
  runner.check_same_runs(points, commands)
