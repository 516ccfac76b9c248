"""Tests of the EMA of the parameters (train.ema_decay): the compiled step (transformer/train/steps.py,
optim.update_ema), its config check, the loop (transformer/train/loop.py: resume, in-training
evaluation) and runs without an EMA (their train state has no EMA node; turning it on at resume
is refused).

Step-level tests use a 1+1-layer d=16 model; loop tests the reverse task of tests/synthetic_task.py.
"""

import functools
import json
import os
import shutil
import subprocess
import sys

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

import synthetic_task
from configs import base
from transformer.config import ConfigError, from_configdict
from transformer.infer import evaluation
from transformer.model import scoring
from transformer.model.models import build_model
from transformer.run import checkpoints, restore
from transformer.run.checkpoints import CheckpointError
from transformer.train import loop, optim, steps

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB = 13


def tiny_config(**overrides):
  """A validated Config of a 1-layer d=16 decoder-only model (the cheapest to compile) trained
  with plain SGD (Adam would turn float rounding on zero gradients into full steps and make
  micro-batched and multi-device runs incomparable), dropout off; overrides are train.* keys or
  dotted keys."""
  cd = base.get_config()
  cd.model.update(arch="decoder_only", d_model=16, num_heads=2, mlp_dim=32, num_decoder_layers=1,
                  vocab_size=VOCAB, source_vocab_size=VOCAB, dropout_rate=0.0, max_len=16)
  cd.data.update(max_source_len=8, max_target_len=8)
  cd.train.update(optimizer="sgd", momentum=0.0, schedule="constant", warmup_steps=0,
                  learning_rate=0.5)
  for key, value in overrides.items():
    cd.update_from_flattened_dict({key if "." in key else f"train.{key}": value})
  return from_configdict(cd)


def batches(n, b=4, seed=0):
  """n random batches with ragged padding (so micro-batches hold different token counts)."""
  rng = np.random.RandomState(seed)
  out = []
  for _ in range(n):
    targets = rng.randint(1, VOCAB, (b, 8)).astype(np.int32)
    for i in range(b):
      targets[i, 3 + i:] = 0
    out.append(dict(targets=targets, weights=(targets != 0).astype(np.float32)))
  return out


DATA = batches(12)


@functools.cache
def train_steps(*overrides):
  """(initial state, the states after each step) of jit-compiled train steps over DATA (or its
  first `num_batches`), for tiny_config(**dict(overrides)); cached: compiling dominates."""
  options = dict(overrides)
  data = DATA[:options.pop("num_batches", len(DATA))]
  cfg = tiny_config(**options)
  model = build_model(cfg.model)
  tx = optim.make_optimizer(cfg.train, cfg.model.d_model)
  state = steps.create_train_state(cfg, model, jax.random.PRNGKey(0), data[0], tx=tx)
  step = jax.jit(steps.make_train_step(cfg, model, tx))
  states = []
  for batch in data:
    states.append(step(states[-1] if states else state, batch)[0])
  return state, states


def abstract_states(**overrides):
  """(abstract initial state, abstract state after one step) by jax.eval_shape: nothing compiles."""
  cfg = tiny_config(**overrides)
  model = build_model(cfg.model)
  tx = optim.make_optimizer(cfg.train, cfg.model.d_model)
  init = jax.eval_shape(lambda: steps.create_train_state(cfg, model, jax.random.PRNGKey(0),
                                                         DATA[0], tx=tx))
  return init, jax.eval_shape(steps.make_train_step(cfg, model, tx), init, DATA[0])[0]


# ---------------------------------------------------------------------------------------- step


def test_ema_follows_the_numpy_recurrence_over_the_stepped_params():
  """After each of 12 steps the state's EMA equals a float64 NumPy recurrence e_n = d_n e_{n-1}
  + (1 - d_n) p_n, e_0 = p_0, d_n = min(0.5, (1 + n) / (10 + n)), over the parameters those same
  steps produced: the warmup regime (n < 8) and the plain decay (n >= 8) both."""
  init, states = train_steps(("ema_decay", 0.5))
  as64 = lambda tree: [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]  # noqa: E731
  ref = as64(init.params)
  for n, state in enumerate(states, start=1):
    d = min(0.5, (1 + n) / (10 + n))
    ref = [d * e + (1 - d) * p for e, p in zip(ref, as64(state.params))]
    for e, r in zip(jax.tree.leaves(state.ema_params), ref):
      np.testing.assert_allclose(np.asarray(e, np.float64), r, rtol=2e-6, atol=1e-7)
  lag = max(float(np.abs(np.asarray(e, np.float64) - p).max())
            for e, p in zip(jax.tree.leaves(states[-1].ema_params), as64(states[-1].params)))
  assert lag > 1e-3  # the EMA lags the params: not a copy of them


def test_ema_is_float32_and_absent_when_off():
  """The EMA is float32 also for bfloat16 params, before and after a step; with ema_decay 0 the
  state has no EMA and flattens to exactly the four fields the TrainState had before the EMA
  existed (step, params, opt_state, rng), so checkpoints keep their layout."""
  for state in abstract_states(ema_decay=0.9, **{"model.param_dtype": "bfloat16"}):
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(state.ema_params)} == {jnp.dtype(jnp.float32)}
  for state in abstract_states():
    assert state.ema_params is None
    tops = {path[0].name for path, _ in jax.tree_util.tree_flatten_with_path(state)[0]}
    assert tops == {"step", "params", "opt_state", "rng"}


def test_ema_with_grad_accumulation_equals_the_large_batch():
  """With 4 micro-batches the EMA after 3 steps equals the one of whole-batch steps (to float32
  summation order): the EMA is updated once per optimizer update, not per micro-batch."""
  _, big = train_steps(("ema_decay", 0.5))
  _, acc = train_steps(("ema_decay", 0.5), ("grad_accum_steps", 4), ("num_batches", 3))
  for a, b in zip(jax.tree.leaves(acc[-1].ema_params), jax.tree.leaves(big[2].ema_params)):
    np.testing.assert_allclose(a, b, atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("value", [1.0, -0.1, 1.5])
def test_ema_decay_outside_unit_interval_is_a_one_line_config_error(value):
  """train.ema_decay must be in [0, 1): 1.0 (a frozen average), negatives and > 1 are rejected
  in one line naming the key."""
  with pytest.raises(ConfigError, match=r"^train\.ema_decay=.* must be in \[0, 1\)") as e:
    tiny_config(ema_decay=value)
  assert "\n" not in str(e.value)


PARALLEL_SCRIPT = r"""
import json, sys
import jax, numpy as np
sys.path[:0] = sys.argv[1:3]  # tests/train (this file) and tests/ (its helpers)
import test_steps_ema as t
from transformer.model.models import build_model
from transformer.train import optim, parallel, steps
assert jax.device_count() == 2
cfg = t.tiny_config(ema_decay=0.5)
model, tx = build_model(cfg.model), optim.make_optimizer(cfg.train, cfg.model.d_model)
data = t.DATA[:3]
init = lambda unbox=True: steps.create_train_state(cfg, model, jax.random.PRNGKey(0), data[0], tx, unbox)
mesh = parallel.make_mesh(t.tiny_config(**{"parallel.mesh_shape.data": 1,
                                           "parallel.mesh_shape.fsdp": 2}).parallel)
shardings = parallel.state_shardings(jax.eval_shape(lambda: init(False)), mesh)
pairs = zip(jax.tree.leaves(shardings.ema_params), jax.tree.leaves(shardings.params))
out = dict(same_shardings=all(a == b for a, b in pairs),
           some_split=any(s.spec != jax.sharding.PartitionSpec()
                          for s in jax.tree.leaves(shardings.ema_params)))
pmesh = parallel.make_mesh(t.tiny_config(**{"parallel.mode": "pmap"}).parallel)
run = parallel.compile_train_step(steps.make_train_step(cfg, model, tx), "pmap", pmesh, None)
state = jax.jit(init)()
flat = lambda tree: [np.asarray(x).ravel().tolist() for x in jax.tree.leaves(tree)]
out["params"] = [flat(state.params)]
state = run.prepare_state(state)
for b in data:
  state, _ = run.step(state, run.prepare_batch(b))
  out["params"].append(flat(run.fetch_state(state).params))
out["ema"] = flat(run.fetch_state(state).ema_params)
replicated = jax.sharding.NamedSharding(pmesh, jax.sharding.PartitionSpec())
out["fetched_replicated"] = all(x.sharding == replicated
                                for x in jax.tree.leaves(run.fetch_state(state)))
print("RESULT" + json.dumps(out))
"""


def test_ema_in_pmap_mode_and_its_mesh_shardings():
  """On 2 fake CPU devices, after 3 steps in pmap mode the EMA equals the NumPy recurrence over
  the params those pmap steps produced (pmap's params themselves are checked against one device
  in tests/train/test_parallel.py); on a fsdp=2 mesh the EMA's shardings are exactly the params'
  (some leaves split over fsdp), so mesh mode shards it like them."""
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu",
             XLA_FLAGS=os.environ.get("XLA_FLAGS", "") +
             " --xla_force_host_platform_device_count=2")
  here = os.path.dirname(os.path.abspath(__file__))
  proc = subprocess.run([sys.executable, "-c", PARALLEL_SCRIPT, here, os.path.join(REPO, "tests")],
                        env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.split("RESULT", 1)[1])
  assert out["same_shardings"] and out["some_split"] and out["fetched_replicated"]
  ref = [np.asarray(x, np.float64) for x in out["params"][0]]
  for n, params in enumerate(out["params"][1:], start=1):
    d = min(0.5, (1 + n) / (10 + n))
    ref = [d * e + (1 - d) * np.asarray(p, np.float64) for e, p in zip(ref, params)]
  assert len(out["ema"]) == len(ref) > 0
  for got, want in zip(out["ema"], ref):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------- loop


def _saved_state(workdir, step):
  """The saved train state of `step` as nested dicts, read with orbax directly."""
  path = os.path.join(workdir, "checkpoints", str(step), "state")
  ckptr = ocp.StandardCheckpointer()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                        ckptr.metadata(path).item_metadata.tree)
  return ckptr.restore(path, target)


def _eval_loss(workdir, params, task):
  """Teacher-forced loss of `params` over the reverse task's eval batches (the sums' ratio)."""
  cfg = restore.load_run_config(workdir)
  step = jax.jit(scoring.make_eval_step(build_model(cfg.model)))
  sums = [jax.device_get(step(params, b)) for b in task.eval_batches("validation")]
  return sum(float(s["loss_sum"]) for s in sums) / sum(float(s["weight_sum"]) for s in sums)


EMA_RUN = {"train.num_steps": 20, "train.ema_decay": 0.9}  # checkpoints 10 and 20, evals at 20


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory):
  """The shared 20-step reverse-task run with ema_decay 0.9 (also tests/run/test_restore.py's)."""
  return synthetic_task.trained_run(tmp_path_factory, "ema", **EMA_RUN)


def test_resume_from_a_mid_run_checkpoint_gives_the_same_ema_bitwise(ema_run, tmp_path):
  """A copy of the run cut back to its step-10 checkpoint, resumed to step 20, ends with the
  uninterrupted run's EMA (and params) bit for bit: the EMA is checkpointed and restored."""
  workdir = str(tmp_path / "cut")
  shutil.copytree(ema_run, workdir)
  shutil.rmtree(os.path.join(workdir, "checkpoints", "20"))
  os.remove(os.path.join(workdir, loop.DONE_FILE))
  result = loop.train_and_evaluate(synthetic_task.config(**EMA_RUN), workdir,
                                       task=synthetic_task.ReverseTask())
  assert result["step"] == 20
  a, b = _saved_state(ema_run, 20), _saved_state(workdir, 20)
  for key in ("ema_params", "params"):
    for x, y in zip(jax.tree.leaves(a[key]), jax.tree.leaves(b[key])):
      assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_in_training_evaluation_and_eval_default_use_the_ema(ema_run):
  """The logged eval/loss of step 20 is the teacher-forced loss of the checkpoint's EMA params,
  not of its raw params (they differ), and evaluate_split evaluates the EMA unless params='raw'."""
  with open(os.path.join(ema_run, "metrics.jsonl")) as f:
    logged = [json.loads(line) for line in f if '"eval/loss"' in line][-1]
  state = _saved_state(ema_run, 20)
  task = synthetic_task.ReverseTask()
  ema_loss, raw_loss = (_eval_loss(ema_run, state["ema_params"], task),
                        _eval_loss(ema_run, state["params"], task))
  assert abs(ema_loss - raw_loss) > 1e-4
  assert logged["eval/loss"] == pytest.approx(ema_loss, rel=1e-6)
  auto = evaluation.evaluate_split(ema_run, "validation", task=task, verbose=False)
  raw = evaluation.evaluate_split(ema_run, "validation", task=task, verbose=False, params="raw")
  assert (auto["params"], raw["params"]) == ("ema", "raw")
  assert auto["loss"] == pytest.approx(ema_loss, rel=1e-6)
  assert raw["loss"] == pytest.approx(raw_loss, rel=1e-6)


@flax.struct.dataclass
class FourFieldState:
  """A train state with no EMA field at all."""
  step: jax.Array
  params: dict
  opt_state: tuple
  rng: jax.Array


def test_an_ema_off_state_checkpoints_as_one_without_an_ema_field(tmp_path):
  """An EMA-off TrainState has no EMA node: a checkpoint written from a four-field state class
  restores bit for bit into it."""
  params = {"dense": {"kernel": jnp.arange(6.0).reshape(2, 3), "bias": jnp.ones(3)}}
  old = FourFieldState(step=jnp.int32(7), params=params,
                            opt_state=optax.adam(1e-3).init(params),
                            rng=steps.key_data(jax.random.PRNGKey(3)))
  cd = synthetic_task.config()
  ckpt = checkpoints.Checkpointer(str(tmp_path), from_configdict(cd).checkpoint)
  ckpt.save(7, old, force=True)
  ckpt.wait()
  new = steps.TrainState(step=old.step, params=old.params, opt_state=old.opt_state, rng=old.rng)
  restored = ckpt.restore(7, checkpoints.abstract_of(new))
  ckpt.close()
  assert isinstance(restored, steps.TrainState) and restored.ema_params is None
  for x, y in zip(jax.tree.leaves(restored), jax.tree.leaves(old), strict=True):
    assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


@pytest.mark.slow  # ~35 s of CPU (two trainings)
def test_turning_the_ema_on_at_resume_is_one_line_and_its_decay_may_change(tmp_path):
  """A run without EMA evaluates its raw parameters; resuming it with an EMA is a one-line
  CheckpointError naming train.ema_decay (the train state would differ); resuming it longer
  without one works."""
  workdir = str(tmp_path / "run")
  cd = synthetic_task.config(**{"train.num_steps": 10})
  task = synthetic_task.ReverseTask()
  loop.train_and_evaluate(cd, workdir, task=task)
  assert set(_saved_state(workdir, 10)) == {"step", "params", "opt_state", "rng"}
  result = evaluation.evaluate_split(workdir, "validation", task=task, verbose=False)
  assert result["params"] == "raw" and result["step"] == 10
  with pytest.raises(CheckpointError, match="train.ema_decay=0.0, this config has 0.9") as e:
    loop.train_and_evaluate(synthetic_task.config(**{"train.num_steps": 20,
                                                         "train.ema_decay": 0.9}), workdir,
                                task=task)
  assert "\n" not in str(e.value)
  longer = synthetic_task.config(**{"train.num_steps": 20})
  assert loop.train_and_evaluate(longer, workdir, task=task)["step"] == 20


@pytest.mark.slow  # ~30 s of CPU (a training with --init_from), ~70 s with the cores shared
def test_fine_tuning_from_an_ema_run_starts_from_its_ema(ema_run, tmp_path):
  """--init_from an EMA run takes its EMA params (what eval.py evaluates), and a fine-tuning run
  with an EMA starts its average there: after one update e_1 = d_1 p_0 + (1 - d_1) p_1 with
  d_1 = min(0.9, 2/11) and p_0 the source run's EMA."""
  workdir = str(tmp_path / "tuned")
  cd = synthetic_task.config(**{"train.num_steps": 1, "train.ema_decay": 0.9})
  loop.train_and_evaluate(cd, workdir, task=synthetic_task.ReverseTask(), init_from=ema_run)
  start, tuned = _saved_state(ema_run, 20)["ema_params"], _saved_state(workdir, 1)
  d = 2 / 11
  for p0, p1, e1 in zip(jax.tree.leaves(start), jax.tree.leaves(tuned["params"]),
                        jax.tree.leaves(tuned["ema_params"]), strict=True):
    want = d * np.asarray(p0, np.float64) + (1 - d) * np.asarray(p1, np.float64)
    np.testing.assert_allclose(np.asarray(e1, np.float64), want, rtol=2e-6, atol=1e-7)
