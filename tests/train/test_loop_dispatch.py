"""train.steps_per_dispatch: K train steps in one compiled lax.scan train exactly as K dispatches of
one step (the loop in transformer/train/loop.py, steps.scan_steps), on the synthetic reverse task."""

import json
import os

import pytest

import synthetic_task
from transformer.config import ConfigError, from_configdict
from transformer.train import loop, start


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _logged(workdir, key):
  return [(r["step"], r[key]) for r in _rows(workdir) if key in r]


def test_dispatch_size_stops_at_every_log_eval_checkpoint_and_the_end():
  """K=4 with logs every 10, evaluations every 20, checkpoints every 10 and 25 steps: dispatches of
  4, 4, 2 reach step 10, ... and the last one ends at 25; K=1 is always 1."""
  cfg = from_configdict(synthetic_task.config(**{"train.num_steps": 25,
                                                 "train.steps_per_dispatch": 4}))
  step, sizes = 0, []
  while step < 25:
    sizes.append(loop.dispatch_size(cfg, step))
    step += sizes[-1]
  assert sizes == [4, 4, 2, 4, 4, 2, 4, 1]
  one = from_configdict(synthetic_task.config())
  assert {loop.dispatch_size(one, s) for s in range(40)} == {1}


def test_scanned_steps_train_exactly_as_single_steps(tmp_path):
  """With dropout on (each step's key matters), K=4 and K=1 log the same train losses, gradient
  norms and learning rates at the same steps, end at the same eval loss and checkpoint the same
  steps: the scan changes the dispatch, not the training."""
  results, workdirs = {}, {}
  for k in (1, 4):
    workdirs[k] = str(tmp_path / f"k{k}")
    cd = synthetic_task.config(**{"train.num_steps": 30, "train.steps_per_dispatch": k,
                                  "train.schedule": "warmup_cosine", "train.warmup_steps": 5})
    results[k] = loop.train_and_evaluate(cd, workdirs[k], task=synthetic_task.ReverseTask())
  for key in ("train/loss", "train/grad_norm", "train/learning_rate", "eval/loss"):
    (steps4, values4), (steps1, values1) = (zip(*_logged(workdirs[k], key)) for k in (4, 1))
    assert steps4 == steps1 and values4 == pytest.approx(values1, rel=1e-6, abs=1e-7), key
  assert [s for s, _ in _logged(workdirs[4], "train/loss")] == [10, 20, 30]
  assert results[4]["eval/loss"] == pytest.approx(results[1]["eval/loss"], rel=1e-6)
  assert (sorted(os.listdir(os.path.join(workdirs[4], "checkpoints")))
          == sorted(os.listdir(os.path.join(workdirs[1], "checkpoints"))))


def test_nan_inside_a_scanned_dispatch_names_its_step(tmp_path):
  """A NaN in batch 12 (step 13, the first step of the dispatch 13-16 at K=4) is named as step 13
  in the one-line error, and no checkpoint after step 10 is written."""
  workdir = str(tmp_path / "run")
  cd = synthetic_task.config(**{"train.num_steps": 30, "checkpoint.every_steps": 5,
                                "train.steps_per_dispatch": 4})
  with pytest.raises(loop.TrainingDiverged, match="at step 13;") as e:
    loop.train_and_evaluate(cd, workdir, task=synthetic_task.ReverseTask(nan_batch=12))
  assert "\n" not in str(e.value)
  assert sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints"))) == [5, 10]


def test_steps_per_dispatch_needs_mesh_mode():
  cfg = from_configdict(synthetic_task.config(**{"train.steps_per_dispatch": 2,
                                                 "parallel.mode": "pmap"}))
  with pytest.raises(ConfigError, match="train.steps_per_dispatch=2 needs parallel.mode=mesh"):
    start.check_loop_config(cfg)
