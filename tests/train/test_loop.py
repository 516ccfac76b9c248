"""Tests of transformer/train/loop.py: the loop, in process, on the synthetic reverse task
(tests/synthetic_task.py)."""

import json
import math
import os

import numpy as np
import pytest

import synthetic_task
from transformer.config import from_configdict
from transformer.run import checkpoints, reporting
from transformer.run.checkpoints import CheckpointError
from transformer.train import loop
from transformer.train import runs as runs_lib


def _jsonl(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _done(workdir):
  path = os.path.join(workdir, loop.DONE_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def test_loop_trains_resumes_finished_run_and_rejects_incompatible_workdir(tmp_path, monkeypatch):
  """The loop lowers the loss (train loss falls, eval loss ends below the uniform ln(vocab)), shows
  it on the progress bar from the first step on, writes its files, checkpoints and train_done.json
  (step 40, reason num_steps, the returned metrics); rerunning the finished run returns at once
  without training (metrics.jsonl unchanged); training it further (num_steps 50) first removes the
  marker, so when that fails (a NaN at step 43) no marker claims the run done; a config with another
  d_model in the same workdir is a one-line CheckpointError naming model.d_model."""
  workdir = str(tmp_path / "run")
  cd = synthetic_task.config(**{"train.num_steps": 40})
  shown, progress = [], reporting.Reporter.progress
  monkeypatch.setattr(reporting.Reporter, "progress", lambda self, step, loss=None: (
      shown.append((step, loss)), progress(self, step, loss))[1])
  result = loop.train_and_evaluate(cd, workdir, task=synthetic_task.ReverseTask())
  assert shown[0][0] == 1 and shown[0][1] > 0  # the bar's loss from the first step on
  logged = [r for r in _jsonl(workdir) if "train/loss" in r]
  assert logged[-1]["train/loss"] < logged[0]["train/loss"]
  assert result["step"] == 40 and result["eval/loss"] < math.log(synthetic_task.VOCAB)
  for name in ("config.json", "provenance.json", "metrics.jsonl", "checkpoints/40"):
    assert os.path.exists(os.path.join(workdir, name)), name
  done = _done(workdir)
  assert (done["step"], done["reason"]) == (40, "num_steps") and done["wall_seconds"] > 0
  assert done["metrics"] == result
  before = _jsonl(workdir)
  again = loop.train_and_evaluate(cd, workdir, task=synthetic_task.ReverseTask())
  assert again["step"] == 40 and again["eval/loss"] == result["eval/loss"]
  assert _jsonl(workdir) == before and _done(workdir) == done
  longer = synthetic_task.config(**{"train.num_steps": 50})
  with pytest.raises(loop.TrainingDiverged, match="at step 43;"):
    loop.train_and_evaluate(longer, workdir, task=synthetic_task.ReverseTask(nan_batch=42))
  assert _done(workdir) is None
  bad = synthetic_task.config(**{"model.d_model": 16})
  with pytest.raises(CheckpointError, match="model.d_model") as e:
    loop.train_and_evaluate(bad, workdir, task=synthetic_task.ReverseTask())
  assert "\n" not in str(e.value)


def test_nan_guard_stops_within_one_step_and_keeps_last_good_checkpoint(tmp_path):
  """A NaN in batch 12 (step 13) raises TrainingDiverged naming step 13 in one line, and no
  checkpoint after step 10 (the last good one) is written."""
  workdir = str(tmp_path / "run")
  cd = synthetic_task.config(**{"train.num_steps": 30, "checkpoint.every_steps": 5})
  with pytest.raises(loop.TrainingDiverged, match="at step 13;") as e:
    loop.train_and_evaluate(cd, workdir, task=synthetic_task.ReverseTask(nan_batch=12))
  assert "\n" not in str(e.value) and "last checkpoint that verifies: step 10" in str(e.value)
  assert sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints"))) == [5, 10]


def test_early_stopping_stops_and_stays_stopped(tmp_path):
  """With patience 1 on a metric that cannot improve (eval/loss in 'max' mode while the loss
  falls) the run stops at the second evaluation (step 10 of 100), leaves train_done.json with
  step 10 and reason early_stop, and a rerun does not resume."""
  workdir = str(tmp_path / "run")
  cd = synthetic_task.config(**{"train.num_steps": 100, "eval.every_steps": 5,
                                "train.early_stop_patience": 1, "train.early_stop_mode": "max"})
  result = loop.train_and_evaluate(cd, workdir, task=synthetic_task.ReverseTask())
  assert result["step"] == 10 and result["early_stop"] == 1.0
  assert (_done(workdir)["step"], _done(workdir)["reason"]) == (10, "early_stop")
  again = loop.train_and_evaluate(cd, workdir, task=synthetic_task.ReverseTask())
  assert again["step"] == 10


def test_a_divergence_before_any_checkpoint_says_there_is_none(tmp_path):
  """A divergence before the first save names no step ('step None'): it says no checkpoint was
  saved yet, or that none verifies."""
  ckpt_cfg = from_configdict(synthetic_task.config()).checkpoint
  ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg)
  run = runs_lib.Run("", str(tmp_path), None, {}, ckpt=ckpt)
  metrics = {"loss": np.float32(np.nan), "grad_norm": np.float32(np.nan)}
  error = runs_lib.RunGroup([run])._diverged(run, 3, np.array([False]), metrics)
  assert error == (f"non-finite training loss=nan grad_norm=nan at step 3; stopped (no "
                        f"checkpoint saved yet in {ckpt.directory})")
  ckpt.close()
