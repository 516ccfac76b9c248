"""The progress a run shows (transformer/run/reporting.py): the ETA from training's own step rate
('compiling' until the first step ends; evaluations not counted), and evaluations as they run, in
training and in eval.py."""

import io
import os
import re

import g2p_mini
import pytest
from transformer.infer import evaluation
from transformer.run import reporting
from transformer.train.loop import train_and_evaluate


def test_eta_follows_the_step_rate_after_compilation_without_evaluations(tmp_path, monkeypatch):
  """Fed fake times: 30 s to the first step (compilation), then 0.1 s a step: the bar says
  'compiling' before the first step, no ETA after it, then the fast rate's ETA (90 steps to go
  at 0.1 s = 0:09); a 50 s evaluation changes nothing; tok/s and the loss stay shown."""
  clock = [0.0]
  monkeypatch.setattr(reporting.time, "perf_counter", lambda: clock[0])
  rep = reporting.Reporter(str(tmp_path), {}, True, total_steps=100, show_progress=True)
  assert rep.status() == "compiling" and str(rep._bar.postfix) == "compiling"
  clock[0] = 30.0
  rep.progress(1, 3.5)
  assert rep.status() == "loss=3.5000"
  for step in range(2, 11):
    clock[0] += 0.1
    rep.progress(step)
  assert rep.status() == "ETA 0:09, loss=3.5000"
  assert str(rep._bar.postfix) == "ETA 0:09, loss=3.5000"
  rep.evaluating()
  clock[0] += 50.0
  rep.evaluated(10, {"eval/loss": 1.0})
  rep.evaluation_done()
  for step in (11, 12):
    clock[0] += 0.1
    rep.progress(step)
  assert rep.timer.eta(12, 100) == pytest.approx(88 * 0.1)  # the 50 s not counted
  rep.add_tokens(100, 60)
  rep.write_scalars(12, {"train/loss": 2.0} | rep.throughput())
  assert re.fullmatch(r"ETA 0:09, loss=2\.0000, tok/s=\d+", rep.status()), rep.status()
  rep.close()
  assert reporting.duration(3725) == "1:02:05" and reporting.duration(65) == "1:05"


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def test_task_progress_is_a_bar_on_a_terminal_and_two_lines_in_a_log():
  """Off a terminal: a line when the task starts, one when it ends (no carriage returns); on a
  terminal: a tqdm bar with the description; disabled: nothing."""
  log = io.StringIO()
  progress = reporting.TaskProgress(lambda n: f"evaluating (decoding {n} examples)", "examples",
                                    log)
  for done in (0, 4, 8):
    progress(done, 8)
  progress.close()
  lines = log.getvalue().splitlines()
  assert lines[0] == "evaluating (decoding 8 examples)" and len(lines) == 2
  assert re.fullmatch(r"  8 examples in 0:0\d", lines[1]) and "\r" not in log.getvalue()
  tty = _Terminal()
  progress = reporting.TaskProgress(lambda n: f"evaluating (decoding {n} examples)", "examples",
                                    tty)
  progress(0, 8)
  progress(8, 8)
  progress.close()
  assert "\revaluating (decoding 8 examples):   0%|" in tty.getvalue()
  quiet = io.StringIO()
  progress = reporting.TaskProgress(str, "examples", quiet, enabled=False)
  progress(0, 8)
  progress.close()
  assert quiet.getvalue() == ""


def test_evaluations_show_their_progress_then_their_result(tmp_path, capsys):
  """A tiny training run's bar says 'compiling' first; its evaluation shows 'evaluating
  (decoding 16 examples)' with the decoded count, then a result line with the step, loss and
  WER. eval.py's evaluation (evaluate_split) says what it scores and decodes, then its table."""
  cd = g2p_mini.config(str(tmp_path / "data"), num_steps=2)
  cd.train.log_every_steps = 1
  workdir = str(tmp_path / "run")
  train_and_evaluate(cd, workdir)
  err = capsys.readouterr().err
  assert "compiling" in err
  assert "evaluating (decoding 16 examples) 16/16" in err, err[-3000:]
  assert re.search(r"step 2: eval/loss \d+\.\d{4}, eval/accuracy [\d.]+, .*eval/wer [\d.]+", err)
  results = evaluation.evaluate_split(workdir, split="test")
  out = capsys.readouterr()
  n = results["coverage"]["split_examples"]
  lines = out.err.splitlines()
  assert lines[0] == "evaluating (scoring the test split)", lines
  assert re.fullmatch(r"  \d+ batches in 0:\d\d", lines[1])
  assert lines[2] == f"evaluating (decoding {n} examples)"
  assert re.fullmatch(rf"  {n} examples in \d+:\d\d", lines[3])
  assert out.out.startswith("split") and os.path.exists(os.path.join(workdir, "metrics.test.json"))
