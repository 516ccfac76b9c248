"""Tests of train.members (transformer/train/members.py): N runs in one vmapped program equal their
separate runs, and each member's workdir is a plain run's, on the synthetic reverse task."""

import json
import os

import jax
import numpy as np
import pytest

import synthetic_task
from transformer.config import ConfigError, from_configdict
from transformer.model import scoring
from transformer.run import checkpoints, restore
from transformer.train import hyper, loop, members, start

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
TOL = 1e-5  # measured: <= 2.4e-7 (losses), <= 1.5e-7 (parameters) on a CPU
# nn.Dropout's constant keep probability and a member's traced one give the same forward pass
# bitwise, but XLA rounds their backward passes apart (1-2 ulp); Adam carries that to 3.7e-5 in
# the parameters after 20 steps (with model.dropout_bits=8 both are <= 1.5e-7).
PARAMS_TOL = 1e-4


def _config(**overrides):
  return synthetic_task.config(**(BASE | overrides))


def _jsonl(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _losses(workdir):
  return [r["train/loss"] for r in _jsonl(workdir) if "train/loss" in r]


def _params(workdir, cd):
  cfg = from_configdict(cd)
  cfg = start.fill_vocab_sizes(cfg, synthetic_task.ReverseTask())
  return jax.device_get(restore.read_params(cfg, workdir).params)


def _max_diff(a, b):
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The members run, stopped at step 10 and resumed to 20 with train.steps_per_dispatch=5 (a
  scan of the vmapped step), and each member's separate, uninterrupted run."""
  root = tmp_path_factory.mktemp("members")
  together = str(root / "together")
  loop.train_and_evaluate(_config(**{"train.members": SPEC, "train.num_steps": 10}),
                              together, task=synthetic_task.ReverseTask())
  result = loop.train_and_evaluate(
      _config(**{"train.members": SPEC, "train.steps_per_dispatch": 5}), together,
      task=synthetic_task.ReverseTask())
  separate = []
  for i, overrides in enumerate(PLAIN):
    workdir = str(root / f"separate{i}")
    loop.train_and_evaluate(_config(**overrides), workdir, task=synthetic_task.ReverseTask())
    separate.append(workdir)
  return together, result, separate


def test_members_equal_their_separate_runs(runs):
  """Each member of a members run (resumed mid-way, then K steps per dispatch) logs its
  separate, uninterrupted run's train losses and eval losses and ends with its parameters (read
  back from its checkpoint) within float tolerance; its workdir holds what the separate run's
  does (config.json with the member's values, provenance, train_done.json, checkpoints)."""
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
      plain = json.load(f)
    assert saved["train"].pop("steps_per_dispatch") == 5
    plain["train"].pop("steps_per_dispatch")
    assert saved == plain  # the member's config is its separate run's
    assert [r["step"] for r in _jsonl(mine) if "train/loss" in r] == [5, 10, 15, 20]
    np.testing.assert_allclose(_losses(mine), _losses(workdir), rtol=0, atol=TOL)
    evals = [[r["eval/loss"] for r in _jsonl(w) if "eval/loss" in r] for w in (mine, workdir)]
    assert len(evals[0]) == 2
    np.testing.assert_allclose(evals[0], evals[1], rtol=0, atol=TOL)
    assert result[f"{name}/eval/loss"] == pytest.approx(evals[1][-1], abs=TOL)
    assert _max_diff(_params(mine, _config(**overrides)),
                     _params(workdir, _config(**overrides))) < PARAMS_TOL
  # the members differ from each other (the test could not pass with one run copied thrice)
  a, b, c = (_losses(os.path.join(together, n)) for n in NAMES)
  assert abs(a[-1] - b[-1]) > 1e-3 and abs(a[-1] - c[-1]) > 1e-3


def test_members_at_different_steps_do_not_resume(runs, tmp_path):
  """Members whose latest checkpoints differ are a one-line CheckpointError naming the steps."""
  import shutil  # pylint: disable=g-import-not-at-top
  together, _, _ = runs
  workdir = str(tmp_path / "copy")
  shutil.copytree(together, workdir)
  shutil.rmtree(os.path.join(workdir, NAMES[1], "checkpoints", "20"))
  with pytest.raises(checkpoints.CheckpointError, match="latest checkpoints differ") as e:
    loop.train_and_evaluate(_config(**{"train.members": SPEC, "train.num_steps": 30}),
                                workdir, task=synthetic_task.ReverseTask())
  assert "seed=1: 10" in str(e.value) and "\n" not in str(e.value)


def test_member_workdirs_restore_evaluate_and_resume_alone(runs, tmp_path):
  """transformer.restore reads each member's workdir (its step, its parameters: their eval loss is
  the one the member logged), the members restore as an ensemble, and a member's workdir resumes
  as a plain run of its own config (from step 20 to 25, metrics.jsonl continued)."""
  from transformer.infer import api  # pylint: disable=g-import-not-at-top
  together, _, _ = runs
  task = synthetic_task.ReverseTask()
  dirs = [os.path.join(together, n) for n in NAMES]
  for name, workdir in zip(NAMES, dirs):
    run = api.restore(workdir, task=task)
    assert run.step == 20
    eval_step = jax.jit(scoring.make_eval_step(run.model))
    sums = {}
    for batch in task.eval_batches("validation"):
      for k, v in eval_step(run.params, batch).items():
        sums[k] = sums.get(k, 0.0) + np.asarray(v, np.float64)
    logged = [r["eval/loss"] for r in _jsonl(workdir) if "eval/loss" in r][-1]
    assert scoring.teacher_forced_metrics(sums)["loss"] == pytest.approx(logged, abs=1e-5), name
  assert len(api.restore(dirs, task=task).members) == 3
  alone = str(tmp_path / "alone")
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.copytree(dirs[1], alone)
  result = loop.train_and_evaluate(_config(**PLAIN[1], **{"train.num_steps": 25}), alone,
                                       task=task)
  assert result["step"] == 25
  assert [r["step"] for r in _jsonl(alone) if "train/loss" in r] == [5, 10, 15, 20, 25]
  with open(os.path.join(alone, loop.DONE_FILE)) as f:
    assert json.load(f)["step"] == 25


@pytest.mark.parametrize("spec, culprit", [
    ("seed=0;model.d_model=64", "model.d_model cannot differ"),
    ("seed=0;data.batch_size=4", "data.batch_size cannot differ"),
    ("seed=0;seed=x", "seed='x' is not a int"),
    ("seed=0;seed", "'seed' is not key=value"),
    ("seed=0;seed=0", "two members are named 'seed=0'"),
    ("seed=0,seed=1;seed=2", "seed is given twice"),
    ("seed=3", "needs at least 2 members"),
    ("seeds:1", "seeds:N needs an integer N >= 2"),
    ("seed=0;train.label_smoothing=1.0", "train.label_smoothing=1.0 must be in [0, 1)"),
    ("seed=0;model.dropout_rate=1.5", "model.dropout_rate=1.5 must be in [0, 1]"),
    ("seed=0;train.learning_rate=-1", "train.learning_rate=-1.0 must be > 0"),
])
def test_bad_member_specs_are_one_line_config_errors(spec, culprit, tmp_path):
  """Each bad train.members is a one-line ConfigError naming the key, before anything trains."""
  with pytest.raises(ConfigError) as e:
    loop.train_and_evaluate(_config(**{"train.members": spec}), str(tmp_path / "w"),
                                task=synthetic_task.ReverseTask())
  assert culprit in str(e.value) and "\n" not in str(e.value)
  assert not os.path.exists(tmp_path / "w")


@pytest.mark.parametrize("overrides, culprit", [
    ({"parallel.mode": "pmap"}, "parallel.mode=mesh"),
    ({"train.early_stop_patience": 2}, "train.early_stop_patience=0"),
])
def test_members_refuse_pmap_and_early_stopping(overrides, culprit, tmp_path):
  """pmap mode and early stopping with train.members are one-line ConfigErrors."""
  with pytest.raises(ConfigError, match=culprit) as e:
    loop.train_and_evaluate(_config(**{"train.members": "seeds:2"}, **overrides),
                                str(tmp_path / "w"), task=synthetic_task.ReverseTask())
  assert "\n" not in str(e.value)


def test_seeds_short_form_and_member_names():
  """seeds:N gives seeds cfg.seed .. cfg.seed+N-1; member names are their overrides, made
  filesystem-safe; the hyperparameters traced are only those that differ."""
  cfg = from_configdict(_config(**{"train.members": "seeds:3", "seed": 5}))
  group = members.members_of(cfg)
  assert [m.name for m in group] == ["seed=5", "seed=6", "seed=7"]
  assert [m.cfg.seed for m in group] == [5, 6, 7]
  assert hyper.stacked([m.cfg for m in group]) == hyper.Hyper()
  assert all(m.cfg.train.members == "" for m in group)
  assert members.member_name({"train.learning_rate": 3e-4, "seed": 2}) == (
      "train.learning_rate=0.0003,seed=2")
  cfg = from_configdict(_config(**{"train.members": SPEC}))
  assert hyper.varying_keys([m.cfg for m in members.members_of(cfg)]) == (
      "train.learning_rate", "train.label_smoothing", "model.dropout_rate")
  assert set(members.MEMBER_KEYS) == {"seed", *hyper.FIELDS}  # the rest is traced


def test_a_shared_override_reaches_the_step():
  """Members that share an override of the base config (both learning rate 1e-3, base 3e-3)
  train with it: the step's schedule is the members' (first step's logged learning rate)."""
  from transformer.train import optim, steps  # pylint: disable=g-import-not-at-top
  from transformer.model.models import build_model  # pylint: disable=g-import-not-at-top
  task = synthetic_task.ReverseTask()
  cfg = start.fill_vocab_sizes(from_configdict(_config(**{
      "train.members": "seed=0,train.learning_rate=1e-3;seed=1,train.learning_rate=1e-3"})), task)
  configs = [m.cfg for m in members.members_of(cfg)]
  build = lambda c: (build_model(c.model), optim.make_optimizer(c.train, c.model.d_model))
  model, tx = build(configs[0])
  batch = next(task.train_iterator())
  one = steps.create_train_state(configs[0], model, jax.random.PRNGKey(0),
                                 {k: v[:1] for k, v in batch.items()}, tx)
  state = jax.tree.map(lambda x: np.stack([x, x]), one)
  _, metrics = jax.jit(members.make_train_step(configs, steps.make_train_step(
      configs[0], model, tx)))(state, batch)
  np.testing.assert_allclose(np.asarray(metrics["learning_rate"]), [1e-3, 1e-3], rtol=1e-6)


@pytest.mark.slow
def test_a_diverging_member_stops_all_members(tmp_path):
  """A NaN in batch 2 (every member reads it) is a one-line TrainingDiverged naming the first
  member and step 3; every member keeps its last good checkpoint (step 2) and no train_done."""
  workdir = str(tmp_path / "w")
  cd = _config(**{"train.members": "seeds:2", "train.num_steps": 6, "checkpoint.every_steps": 2})
  with pytest.raises(loop.TrainingDiverged, match="member seed=0: .* at step 3; stopped all "
                     "2 members") as e:
    loop.train_and_evaluate(cd, workdir, task=synthetic_task.ReverseTask(nan_batch=2))
  assert "\n" not in str(e.value)
  for name in ("seed=0", "seed=1"):
    assert os.listdir(os.path.join(workdir, name, "checkpoints")) == ["2"]
    assert not os.path.exists(os.path.join(workdir, name, loop.DONE_FILE))


@pytest.mark.parametrize("bits", [8, 32])
def test_traced_dropout_rate_keeps_what_the_static_rate_keeps(bits):
  """layers.dropout under a vmap over rates [0, 0.1, 0.3, 1] equals the static rate's result
  element for element (a traced 0 is x exactly; 1 drops everything)."""
  from transformer.model import layers  # pylint: disable=g-import-not-at-top
  x = jax.random.normal(jax.random.PRNGKey(1), (4, 6, 8))
  key = jax.random.PRNGKey(2)
  rates = [0.0, 0.1, 0.3, 1.0]
  traced = jax.vmap(lambda r: layers.dropout(x, r, key, bits))(np.asarray(rates, np.float32))
  for rate, got in zip(rates, traced):
    want = x if rate == 0 else layers.dropout(x, rate, key, bits)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=0)
    assert int(np.sum(np.asarray(got) == 0)) == int(np.sum(np.asarray(want) == 0))


# Each optimizer and loss key a member may vary, moved off the base in some member, each member
# set against its separate run (the base member has clipping and decay off: their traced "off").
OPT_PLAIN = [{"seed": 0},
             {"seed": 0, "train.weight_decay": 0.1, "train.warmup_steps": 3, "train.z_loss": 0.01},
             {"seed": 0, "train.b1": 0.8, "train.b2": 0.95, "train.grad_clip": 0.05}]
OPT_BASE = {"train.num_steps": 8, "train.log_every_steps": 2, "eval.every_steps": 8,
            "checkpoint.every_steps": 8, "train.optimizer": "adamw",
            "train.schedule": "warmup_linear", "train.warmup_steps": 0}


# default coverage: tests/train/test_optim.py's traced keys equal their Python values
@pytest.mark.slow
def test_optimizer_and_loss_keys_vary_per_member(tmp_path):
  """A members run varying weight decay, warmup, Adam's betas, z-loss and clipping logs each
  member's separate run's train losses, grad norms and learning rates (within 1e-5)."""
  spec = ";".join(",".join(f"{k}={v}" for k, v in o.items()) for o in OPT_PLAIN)
  cfg = from_configdict(_config(**OPT_BASE, **{"train.members": spec}))
  assert hyper.varying_keys([m.cfg for m in members.members_of(cfg)]) == (
      "train.weight_decay", "train.warmup_steps", "train.b1", "train.b2", "train.z_loss",
      "train.grad_clip")
  together = str(tmp_path / "together")
  loop.train_and_evaluate(_config(**OPT_BASE, **{"train.members": spec}), together,
                          task=synthetic_task.ReverseTask())
  finals = []
  for i, overrides in enumerate(OPT_PLAIN):
    alone = str(tmp_path / f"alone{i}")
    loop.train_and_evaluate(_config(**(OPT_BASE | overrides)), alone,
                            task=synthetic_task.ReverseTask())
    mine = os.path.join(together, members.member_name(overrides))
    for key in ("train/loss", "train/grad_norm", "train/learning_rate"):
      got, want = ([r[key] for r in _jsonl(w) if key in r] for w in (mine, alone))
      assert len(got) == 4, key
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{overrides} {key}")
    finals.append(_losses(alone)[-1])
  assert abs(finals[0] - finals[1]) > 1e-3 and abs(finals[0] - finals[2]) > 1e-3


def test_mup_members_with_traced_learning_rates_equal_their_separate_steps():
  """Under µP (d_model 32 on base 8: hidden matrices at lr / 4) a members step with traced
  learning rates 1e-3 and 4e-3 equals each member's own step, 3 steps, within 1e-5; the rates
  reach the update (the members' parameters differ)."""
  from transformer.train import optim, steps  # pylint: disable=g-import-not-at-top
  from transformer.model.models import build_model  # pylint: disable=g-import-not-at-top
  task = synthetic_task.ReverseTask()
  mup = {"model.parametrization": "mup", "model.mup_base_width": 8, "model.dropout_rate": 0.0,
         "model.use_bias": False}
  cfg = start.fill_vocab_sizes(from_configdict(_config(**mup, **{
      "train.members": "train.learning_rate=1e-3;train.learning_rate=4e-3"})), task)
  configs = [m.cfg for m in members.members_of(cfg)]
  build = lambda c: (build_model(c.model), optim.make_optimizer(c.train, c.model))
  model, tx = build(configs[0])
  batch = next(task.train_iterator())
  one = steps.create_train_state(configs[0], model, jax.random.PRNGKey(0),
                                 {k: v[:1] for k, v in batch.items()}, tx)
  together = jax.tree.map(lambda x: np.stack([x, x]), one)
  step = jax.jit(members.make_train_step(configs, steps.make_train_step(configs[0], model, tx)))
  alone = [one, one]
  singles = [jax.jit(steps.make_train_step(c, *build(c))) for c in configs]
  for _ in range(3):
    together, _ = step(together, batch)
    alone = [s(a, batch)[0] for s, a in zip(singles, alone)]
  for i in range(2):
    assert _max_diff(jax.tree.map(lambda x, i=i: x[i], together.params), alone[i].params) < TOL
  assert _max_diff(alone[0].params, alone[1].params) > 1e-4
