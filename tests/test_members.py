"""Tests of train.members (transformer/members.py): N runs in one vmapped program equal their
separate runs, and each member's workdir is a plain run's, on the synthetic reverse task."""

import json
import os

import jax
import numpy as np
import pytest

import synthetic_task
from transformer import checkpoints, members, training
from transformer.config import ConfigError, from_configdict

SPEC = "seed=0;seed=1;seed=0,train.learning_rate=1e-3,train.label_smoothing=0.2,model.dropout_rate=0"
NAMES = ["seed=0", "seed=1",
         "seed=0,train.learning_rate=0.001,train.label_smoothing=0.2,model.dropout_rate=0"]
# The member's own settings, as a plain run's overrides.
PLAIN = [{"seed": 0}, {"seed": 1}, {"seed": 0, "train.learning_rate": 1e-3,
                                    "train.label_smoothing": 0.2, "model.dropout_rate": 0.0}]
# No biases: a key projection's bias has a zero gradient up to rounding, which Adam (eps 1e-9)
# turns into full-size steps of either sign, so two float orders of one run already differ there.
BASE = {"train.num_steps": 20, "train.log_every_steps": 5, "eval.every_steps": 10,
        "checkpoint.every_steps": 10, "model.use_bias": False}
TOL = 2e-5


def _config(**overrides):
  return synthetic_task.config(**(BASE | overrides))


def _jsonl(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _losses(workdir):
  return [r["train/loss"] for r in _jsonl(workdir) if "train/loss" in r]


def _params(workdir, cd):
  cfg = from_configdict(cd)
  cfg = training.fill_vocab_sizes(cfg, synthetic_task.ReverseTask())
  return jax.device_get(checkpoints.read_params(cfg, workdir).params)


def _max_diff(a, b):
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The members run (20 steps) and each member's separate run."""
  root = tmp_path_factory.mktemp("members")
  together = str(root / "together")
  result = training.train_and_evaluate(_config(**{"train.members": SPEC}), together,
                                       task=synthetic_task.ReverseTask())
  separate = []
  for i, overrides in enumerate(PLAIN):
    workdir = str(root / f"separate{i}")
    training.train_and_evaluate(_config(**overrides), workdir, task=synthetic_task.ReverseTask())
    separate.append(workdir)
  return together, result, separate


def test_members_equal_their_separate_runs(runs):
  """Each member's logged train losses, eval loss and final parameters (read back from its
  checkpoint) equal its separate run's within float tolerance, and its workdir holds what the
  separate run's does (config.json with the member's values, train_done.json, checkpoints)."""
  together, result, separate = runs
  assert result["step"] == 20
  for name, overrides, workdir in zip(NAMES, PLAIN, separate):
    mine = os.path.join(together, name)
    for f in ("config.json", "provenance.json", "metrics.jsonl", "train_done.json",
              "checkpoints/20", "checkpoints/10"):
      assert os.path.exists(os.path.join(mine, f)), (name, f)
    with open(os.path.join(mine, "config.json")) as f:
      saved = json.load(f)
    with open(os.path.join(workdir, "config.json")) as f:
      assert saved == json.load(f)  # the member's config is its separate run's
    np.testing.assert_allclose(_losses(mine), _losses(workdir), rtol=0, atol=TOL)
    assert len(_losses(mine)) == 4
    evals = [[r["eval/loss"] for r in _jsonl(w) if "eval/loss" in r] for w in (mine, workdir)]
    np.testing.assert_allclose(evals[0], evals[1], rtol=0, atol=TOL)
    assert result[f"{name}/eval/loss"] == pytest.approx(evals[1][-1], abs=TOL)
    assert _max_diff(_params(mine, _config(**overrides)),
                     _params(workdir, _config(**overrides))) < TOL
  # the members differ from each other (the test could not pass with one run copied thrice)
  a, b, c = (_losses(os.path.join(together, n)) for n in NAMES)
  assert abs(a[-1] - b[-1]) > 1e-3 and abs(a[-1] - c[-1]) > 1e-3
