"""Tests of checkpoint averaging and the choice of EMA or raw parameters at evaluation:
restore.average_trees, restore.read_params, evaluation.evaluate_split, api.restore and eval.py's
--params / --average_last.

The numbers come from the shared 20-step reverse-task run with an EMA (tests/synthetic_task.py,
checkpoints 10 and 20, checkpoint.keep=2), read back one by one with orbax directly as the
reference; eval.py runs on a copy of the mini G2P run (tests/g2p_mini.py, no EMA, one checkpoint).
"""

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

import g2p_mini
import synthetic_task
from transformer.infer import api, evaluation
from transformer.model import scoring
from transformer.model.models import build_model
from transformer.run import restore
from transformer.run.restore import EvaluationError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The same run as tests/train/test_steps_ema.py's.
EMA_RUN = {"train.num_steps": 20, "train.ema_decay": 0.9}


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory):
  """A private copy of the shared EMA run (evaluation writes its results into the workdir)."""
  shared = synthetic_task.trained_run(tmp_path_factory, "ema", **EMA_RUN)
  return str(shutil.copytree(shared, tmp_path_factory.mktemp("averaging") / "run"))


def saved(workdir, step, key):
  """The `key` subtree ('params' or 'ema_params') of checkpoint `step`, read with orbax directly,
  as float32 NumPy arrays in leaf order."""
  path = os.path.join(workdir, "checkpoints", str(step), "state")
  ckptr = ocp.StandardCheckpointer()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                        ckptr.metadata(path).item_metadata.tree)
  return [np.asarray(x, np.float32) for x in jax.tree.leaves(ckptr.restore(path, target)[key])]


def numpy_mean(workdir, steps_, key):
  return [np.mean(np.stack(leaves), axis=0, dtype=np.float32)
          for leaves in zip(*(saved(workdir, s, key) for s in steps_))]


def assert_leaves_close(tree, leaves, **tol):
  got = jax.tree.leaves(tree)
  assert len(got) == len(leaves) > 0
  for x, y in zip(got, leaves):
    np.testing.assert_allclose(np.asarray(x, np.float32), y, **(tol or dict(rtol=1e-6, atol=1e-7)))


def test_average_trees_is_the_float32_mean_cast_back():
  """average_trees of 3 trees with float32 and bfloat16 leaves equals NumPy's float32 mean of
  each leaf, cast back to the leaf's dtype (exactly for bfloat16, to rounding for float32)."""
  rng = np.random.RandomState(0)
  trees = [{"a": jnp.asarray(rng.randn(4, 3), jnp.float32),
            "b": {"c": jnp.asarray(rng.randn(5), jnp.bfloat16)}} for _ in range(3)]
  mean = restore.average_trees(trees)
  assert mean["a"].dtype == jnp.float32 and mean["b"]["c"].dtype == jnp.bfloat16
  want_a = np.mean(np.stack([np.asarray(t["a"]) for t in trees]), axis=0)
  want_c = np.mean(np.stack([np.asarray(t["b"]["c"], np.float32) for t in trees]), axis=0)
  np.testing.assert_allclose(np.asarray(mean["a"]), want_a, rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(mean["b"]["c"], np.float32),
                                np.asarray(jnp.asarray(want_c).astype(jnp.bfloat16), np.float32))


@pytest.mark.parametrize("which,key", [("raw", "params"), ("ema", "ema_params"),
                                       ("auto", "ema_params")])
def test_averaged_params_are_the_numpy_mean_of_the_checkpoints(ema_run, which, key):
  """read_params(average_last=2) is the NumPy mean of the two checkpoints' params (or EMA params;
  'auto' picks the EMA of an EMA run), each read back with orbax; average_last=1 is the latest
  checkpoint's exactly."""
  cfg = restore.load_run_config(ema_run)
  two = restore.read_params(cfg, ema_run, params=which, average_last=2)
  assert (two.step, two.steps, two.source) == (20, (10, 20), "raw" if which == "raw" else "ema")
  assert_leaves_close(two.params, numpy_mean(ema_run, [10, 20], key))
  one = restore.read_params(cfg, ema_run, params=which, average_last=1)
  assert one.steps == (20,)
  for x, y in zip(jax.tree.leaves(one.params), saved(ema_run, 20, key), strict=True):
    np.testing.assert_array_equal(np.asarray(x), y)


def test_evaluate_split_averages_and_says_which_checkpoints(ema_run):
  """evaluate_split(average_last=2, params='raw') reports the teacher-forced loss of the NumPy
  mean of the raw params of steps 10 and 20 (scored here by the eval step directly), and its
  results, metrics file and table name the averaged steps and the params; average_last=1 gives
  the plain latest evaluation's loss exactly."""
  task = synthetic_task.ReverseTask()
  results = evaluation.evaluate_split(ema_run, "validation", task=task, verbose=False,
                                      params="raw", average_last=2)
  assert (results["params"], results["averaged_steps"], results["step"]) == ("raw", [10, 20], 20)
  mean = numpy_mean(ema_run, [10, 20], "params")
  cfg = restore.load_run_config(ema_run)
  template = restore.read_params(cfg, ema_run, params="raw").params
  params = jax.tree.unflatten(jax.tree.structure(template), [jnp.asarray(x) for x in mean])
  step = jax.jit(scoring.make_eval_step(build_model(cfg.model)))
  sums = [jax.device_get(step(params, b)) for b in task.eval_batches("validation")]
  want = sum(float(s["loss_sum"]) for s in sums) / sum(float(s["weight_sum"]) for s in sums)
  assert results["loss"] == pytest.approx(want, rel=1e-5)
  with open(os.path.join(ema_run, "metrics.validation.json")) as f:
    written = json.load(f)
  assert (written["averaged_steps"], written["params"]) == ([10, 20], "raw")
  table = evaluation.format_table(results)
  assert [line.split() for line in table.splitlines() if line.startswith("averaged_steps")] == [
      ["averaged_steps", "10,", "20"]]
  one = evaluation.evaluate_split(ema_run, "validation", task=task, verbose=False, average_last=1)
  latest = evaluation.evaluate_split(ema_run, "validation", task=task, verbose=False)
  assert one["loss"] == latest["loss"] and one["params"] == latest["params"] == "ema"
  assert "averaged_steps" not in latest


def test_restore_takes_params_and_average_last(ema_run):
  """restore() gives the EMA of an EMA run by default, the raw params with params='raw', and the
  mean of the 2 newest checkpoints' EMA with average_last=2; the Run says which."""
  task = synthetic_task.ReverseTask()
  run = api.restore(ema_run, task=task)
  assert (run.params_source, run.averaged_steps, run.step) == ("ema", (), 20)
  assert_leaves_close(run.params, saved(ema_run, 20, "ema_params"), rtol=0, atol=0)
  raw = api.restore(ema_run, task=task, params="raw")
  assert_leaves_close(raw.params, saved(ema_run, 20, "params"), rtol=0, atol=0)
  averaged = api.restore(ema_run, task=task, average_last=2)
  assert averaged.averaged_steps == (10, 20) and "averaged_steps=[10, 20]" in repr(averaged)
  assert_leaves_close(averaged.params, numpy_mean(ema_run, [10, 20], "ema_params"))


@pytest.mark.parametrize("kwargs,message", [
    (dict(average_last=3), r"^--average_last=3 needs the run's 3 newest checkpoints; it keeps "
                           r"the last checkpoint\.keep=2 \(steps found in .*: \[10, 20\]\)"),
    (dict(average_last=2, step=10), r"^--average_last=2 averages the newest checkpoints; it "
                                    r"cannot be combined with --step=10"),
    (dict(average_last=-1), r"^--average_last=-1 must be an integer >= 0"),
    (dict(params="mean"), r"^--params='mean' is not one of auto\|ema\|raw"),
])
def test_bad_requests_are_one_line_errors(ema_run, kwargs, message):
  """Averaging more checkpoints than were kept names checkpoint.keep and the steps found; a
  --step with --average_last, a negative count and an unknown --params are one-line errors."""
  cfg = restore.load_run_config(ema_run)
  with pytest.raises(EvaluationError, match=message) as e:
    restore.read_params(cfg, ema_run, **kwargs)
  assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def g2p_run(tmp_path_factory):
  """A private copy of the mini G2P run (no EMA, one checkpoint at step 60, checkpoint.keep=2)."""
  shared = g2p_mini.trained_run(tmp_path_factory)
  return str(shutil.copytree(shared, tmp_path_factory.mktemp("g2p_avg") / "run"))


def test_eval_py_flags(g2p_run):
  """eval.py --params=raw --average_last=1 evaluates and prints/writes params and averaged_steps;
  --average_last=2 on a run holding one checkpoint is one `error:` line naming checkpoint.keep and
  the steps found; --params=ema on a run without an EMA is one line saying so."""
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  base = [sys.executable, "eval.py", f"--workdir={g2p_run}", "--split=test",
          "--config.eval.num_decode_examples=4"]
  ok = subprocess.run(base + ["--params=raw", "--average_last=1"], cwd=REPO, env=env,
                      capture_output=True, text=True, timeout=300)
  assert ok.returncode == 0, ok.stderr[-2000:]
  rows = {line.split()[0]: line.split()[1:] for line in ok.stdout.splitlines() if line.strip()}
  assert rows["params"] == ["raw"] and rows["averaged_steps"] == ["60"]
  with open(os.path.join(g2p_run, "metrics.test.json")) as f:
    assert json.load(f)["averaged_steps"] == [60]
  bad = subprocess.run(base + ["--average_last=2"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
  assert bad.returncode == 1
  lines = bad.stderr.strip().splitlines()
  assert lines[-1].startswith("error: --average_last=2 needs the run's 2 newest checkpoints; it "
                              "keeps the last checkpoint.keep=2 (steps found in ")
  assert lines[-1].endswith("[60]); average fewer, or train with --config.checkpoint.keep=2 or "
                            "more")
  cfg = restore.load_run_config(g2p_run)
  with pytest.raises(EvaluationError, match=r"^--params=ema: .*/60 holds no EMA .*use "
                                            r"--params=raw$"):
    restore.read_params(cfg, g2p_run, params="ema")
