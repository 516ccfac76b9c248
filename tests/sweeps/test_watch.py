"""The sweep's console (transformer/sweeps/watch.py): a running point's status line from its
metrics.jsonl, the lines of a failed and a finished point, the live lines while points run (plain
lines in a log, redrawn in place on a terminal), and sweep.py naming a failed point's log."""

import io
import json
import os
import re

from sweep_fixtures import TINY, fake, sweep_cli, write_sweep  # noqa: F401  (fake: a fixture)
from transformer.sweeps import runner, spec, watch


def _write_rows(workdir, rows):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


def test_status_line_from_metrics_jsonl(tmp_path):
  """Step of num_steps, the latest train/loss, the latest in-training metric (wer before loss)
  and the ETA at the rate between the first and the latest logged step: 100 steps in 50 s
  (an evaluation between them counted), 700 to go = 350 s = 5:50. A cut last line is skipped;
  nothing logged yet says so; one logged step has no rate, so no ETA."""
  rows = [{"step": 100, "train/loss": 3.0, "time/elapsed_s": 40.0},  # 40 s: compilation
          {"step": 150, "train/loss": 2.5, "time/elapsed_s": 60.0},
          {"step": 150, "eval/loss": 2.6, "eval/wer": 0.41234, "eval/decoded_examples": 16.0,
           "time/elapsed_s": 65.0},
          {"step": 200, "train/loss": 2.25, "time/elapsed_s": 90.0}]
  _write_rows(str(tmp_path), rows)
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 250, "train/lo')  # a line a kill cut
  got = watch.status_line("lr=0.5", watch.metrics_rows(str(tmp_path)), 900)
  assert got == "lr=0.5: step 200/900  loss 2.2500  dev/wer 0.4123  ETA 5:50"
  assert watch.status_line("p", [], 900) == (
      "p: starting (no step logged yet: loading data, compiling)")
  assert watch.status_line("p", rows[:1], 900) == "p: step 100/900  loss 3.0000"
  assert watch.eta_seconds(rows, 14600) == 7200  # 2 steps/s; "h:mm:ss" from an hour on:
  assert watch.status_line("p", rows, 14600).endswith("ETA 2:00:00")



def test_status_line_of_a_log_holding_nan_and_infinities(tmp_path):
  """NaN and infinite losses are shown as such; a NaN or infinite time gives no ETA (never a
  crash of the console's thread); an ETA past a thousand hours is not spelled out."""
  nan, inf = float("nan"), float("inf")
  for elapsed in (nan, inf, -inf):
    rows = [{"step": 10, "train/loss": 1.0, "time/elapsed_s": 0.0},
            {"step": 20, "train/loss": nan, "time/elapsed_s": elapsed},
            {"step": 20, "eval/loss": inf}]
    assert watch.status_line("p", rows, 100) == "p: step 20/100  loss nan  dev/loss inf"
  slow = [{"step": 1, "train/loss": 1.0, "time/elapsed_s": 0.0},
          {"step": 2, "train/loss": 1.0, "time/elapsed_s": 1e308}]
  assert watch.status_line("p", slow, 100).endswith("ETA ?")  # 98 * 1e308 s: an infinity
  assert watch.duration(3600.0 * 1000) == ">999:59:59" and watch.duration(nan) == "?"

FAIL_LOUDLY = """
import sys
print("step 1/3 | 5.00 step/s\\r", end="")
print("Traceback (most recent call last):")
print("ValueError: data.train_file='/nope.tsv': no such file")
print("  (a line after the error)")
sys.exit(2)
"""

SLOW_TRAIN = """
import json, os, sys, time
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
w, n = args["workdir"], int(args["config.train.num_steps"])
lr = float(args["config.train.learning_rate"])
os.makedirs(w, exist_ok=True)
for s in range(1, n + 1):
  time.sleep(0.3)
  with open(os.path.join(w, "metrics.jsonl"), "a") as f:
    f.write(json.dumps({"step": s, "train/loss": 1.0 / s, "time/elapsed_s": 0.3 * s}) + "\\n")
with open(os.path.join(w, "metrics.jsonl"), "a") as f:
  f.write(json.dumps({"step": n, "eval/loss": lr, "eval/wer": lr / 10}) + "\\n")
os.makedirs(os.path.join(w, "checkpoints", str(n)), exist_ok=True)
json.dump({"step": n, "reason": "num_steps"}, open(os.path.join(w, "train_done.json"), "w"))
"""


def test_failed_point_line_names_exit_code_log_and_last_error(fake, tmp_path):
  """A point whose trainer fails gets one line at once: its name, the stage and exit code, its
  sweep.log's path and that log's last error line (not the progress bar's, not the command's)."""
  points, commands = fake
  (tmp_path / "fail.py").write_text(FAIL_LOUDLY)
  failing = spec.Commands(**{**commands.__dict__, "train_script": str(tmp_path / "fail.py")})
  lines = []
  assert runner.run(points[:1], failing, echo=lines.append) == points[:1]
  log = os.path.join(points[0].workdir, runner.LOG)
  assert lines == ["[1/1] lr=0.5: new",
                   f"lr=0.5: FAILED (train, exit code 2), see {log}: ValueError: "
                   "data.train_file='/nope.tsv': no such file"]
  assert watch.failed_line(points[0], {"stage": "eval", "returncode": -9}, log).startswith(
      "lr=0.5: FAILED (eval, killed by SIGKILL), see ")


def test_running_points_print_status_lines_then_their_result(fake, tmp_path):
  """While two points train (parallel=2), the console prints plain lines (no control
  characters) for each point as its logged step moves, then a line with its result: the time,
  the final step and eval.py's test/wer."""
  points, commands = fake
  (tmp_path / "slow.py").write_text(SLOW_TRAIN)
  slow = spec.Commands(**{**commands.__dict__, "train_script": str(tmp_path / "slow.py")})
  lines = []
  console = watch.Console(lines.append, every=0.05)
  assert runner.run(points[:2], slow, parallel=2, console=console) == []
  assert not any("\x1b" in line or "\r" in line for line in lines)
  for p in points[:2]:
    status = [line for line in lines if line.startswith(f"{p.name}: step ")]
    assert len(status) >= 2 and len(set(status)) == len(status), lines  # each when it moved
    assert re.fullmatch(rf"{p.name}: step \d/3  loss \d\.\d{{4}}(  dev/wer \S+)?(  ETA \d:\d\d)?",
                        status[-1]), status
    done = [line for line in lines if line.startswith(f"{p.name}: finished")]
    wer = 2 * float(p.overrides["train.learning_rate"]) / 10  # fake_eval.py's test/wer
    assert len(done) == 1 and re.fullmatch(
        rf"{p.name}: finished in 0:0\d, step 3, test/wer {wer:.4f}", done[0]), done
    assert lines.index(status[-1]) < lines.index(done[0])


def test_terminal_status_lines_are_redrawn_in_place(tmp_path):
  """On a terminal the status lines sit below the other lines: a refresh moves up over them and
  clears before drawing the new ones; a line said meanwhile goes above them; an ended point's
  line is drawn no more."""
  point = spec.Point(0, {}, "p", str(tmp_path / "p"), 10)
  _write_rows(point.workdir, [{"step": 4, "train/loss": 1.5, "time/elapsed_s": 1.0}])
  out = io.StringIO()
  console = watch.Console(stream=out)
  console.running(point, "train")
  console.refresh()
  assert out.getvalue() == "p: step 4/10  loss 1.5000\n"
  console.say("q: finished")
  assert out.getvalue().endswith("\x1b[1F\x1b[Jq: finished\np: step 4/10  loss 1.5000\n")
  console.ended(point)  # the line that says so erases its status line for good
  console.say("p: finished")
  assert out.getvalue().endswith("p: step 4/10  loss 1.5000\n\x1b[1F\x1b[Jp: finished\n")
  console.refresh()
  assert out.getvalue().endswith("p: finished\n")


def test_sweep_py_names_a_failed_points_log(tmp_path):
  """sweep.py with a bad data path: the point's train.py fails; the console's line names the
  point, the exit code, its sweep.log and the error train.py wrote there; exit 1, no traceback."""
  path = write_sweep(tmp_path, 'def get_sweep():\n  return sweep("train.learning_rate", [0.5])\n')
  w = tmp_path / "w"
  out = sweep_cli(f"--config={TINY}", f"--sweep={path}", f"--workdir={w}", "--eval_split=",
                  f"--config.data.train_file={tmp_path / 'missing.tsv'}",
                  f"--config.data.data_dir={tmp_path / 'tfds'}", timeout=300)
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
  log = w / "lr=0.5" / runner.LOG
  assert (f"lr=0.5: FAILED (train, exit code 1), see {log}: error: data.train_file="
          f"'{tmp_path / 'missing.tsv'}': no such file") in out.stdout.splitlines(), out.stdout
  assert "\x1b" not in out.stdout  # a pipe: no control characters
