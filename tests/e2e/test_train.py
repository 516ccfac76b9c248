"""End-to-end training runs in subprocesses: kill -9 and SIGTERM mid-run, resume, train.py errors.

The runs train the 1+1-layer model of tests/synthetic_task.py (dropout on, so the step keys matter)
for 60 steps; a persistent compilation cache shared by the runs keeps them to a few seconds each.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

import cmudict_data

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(ROOT, "tests")
STEPS = 60
RUNNER = f"""
import json, sys
sys.path.insert(0, {TESTS!r})
import synthetic_task
from transformer.train import loop
overrides = {{"train.num_steps": {STEPS}, "checkpoint.every_steps": 10}}
overrides.update(json.loads(sys.argv[2]) if len(sys.argv) > 2 else {{}})
cd = synthetic_task.config(**overrides)
print(loop.train_and_evaluate(cd, sys.argv[1], task=synthetic_task.ReverseTask()))
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  cache = str(tmp_path_factory.mktemp("jax_cache"))
  return dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=cache,
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", PYTHONPATH=ROOT)


def start(workdir, env, overrides="{}"):
  return subprocess.Popen([sys.executable, "-c", RUNNER, workdir, overrides], env=env, cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(workdir, env, overrides="{}"):
  proc = start(workdir, env, overrides)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-2000:]
  return out


def steps(workdir):
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(s) for s in os.listdir(d) if s.isdigit()) if os.path.isdir(d) else []


def interrupt_after_first_checkpoint(workdir, env, sig):
  """Starts a run and sends `sig` as soon as checkpoint 10 is committed; returns the process."""
  proc = start(workdir, env)
  deadline = time.time() + 240
  while not steps(workdir) and proc.poll() is None and time.time() < deadline:
    time.sleep(0.02)
  proc.send_signal(sig)
  proc.communicate(timeout=120)
  return proc


def final_params(workdir):
  path = os.path.join(workdir, "checkpoints", str(STEPS), "state")
  import jax  # pylint: disable=g-import-not-at-top
  ckptr = ocp.StandardCheckpointer()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])  # whatever device count saved it
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                        ckptr.metadata(path).item_metadata.tree)
  state = ckptr.restore(path, target)
  return state["params"], int(state["step"])


def assert_identical(a, b):
  import jax  # pylint: disable=g-import-not-at-top
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b) > 0
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, env):
  workdir = str(tmp_path_factory.mktemp("uninterrupted"))
  run(workdir, env)
  return final_params(workdir)


@pytest.mark.slow  # ~70 s; benchmarks/faults.py (test_faults, slow) kills and resumes 4 times more
def test_sigkill_then_rerun_is_bitwise_identical(tmp_path, env, reference):
  """kill -9 after the first checkpoint, then the same command again: the run resumes from a
  checkpoint (not from scratch) and ends with parameters bitwise equal to an uninterrupted run;
  a third run of the finished workdir trains nothing (metrics.jsonl unchanged)."""
  workdir = str(tmp_path / "killed")
  proc = interrupt_after_first_checkpoint(workdir, env, signal.SIGKILL)
  assert proc.returncode == -signal.SIGKILL
  resumed_from = steps(workdir)[-1]
  assert 10 <= resumed_from < STEPS, "the run must be killed mid-run"
  run(workdir, env)
  params, step = final_params(workdir)
  assert step == STEPS
  assert_identical(params, reference[0])
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    before = f.read()
  run(workdir, env)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    assert f.read() == before


@pytest.mark.slow  # ~60 s; the same save-and-resume path runs in test_interrupt's Ctrl-C tests
def test_sigterm_saves_exits_zero_and_resumes(tmp_path, env, reference):
  """SIGTERM mid-run saves a checkpoint at the current step and exits with status 0 without
  train_done.json (the run is not finished); rerunning resumes from it, ends bitwise equal to the
  uninterrupted run and writes the marker at the last step."""
  workdir = str(tmp_path / "preempted")
  done = os.path.join(workdir, "train_done.json")
  proc = interrupt_after_first_checkpoint(workdir, env, signal.SIGTERM)
  assert proc.returncode == 0
  assert 10 <= steps(workdir)[-1] < STEPS and not os.path.exists(done)
  run(workdir, env)
  assert_identical(final_params(workdir)[0], reference[0])
  with open(done) as f:
    assert json.load(f)["step"] == STEPS


def test_train_py_config_error_is_one_line(tmp_path):
  """train.py with an invalid override prints exactly one line naming the key and exits 1."""
  proc = subprocess.run(
      [sys.executable, "train.py", "--config=configs/base.py", "--config.model.num_heads=7",
       f"--workdir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines() == [
      "error: model.num_heads=7 must divide model.d_model=512 (or set model.head_dim)"]


SGD = {"model.dropout_rate": 0.0, "train.optimizer": "sgd", "train.learning_rate": 0.1}


@pytest.fixture(scope="module")
def reference_no_dropout(tmp_path_factory, env):
  workdir = str(tmp_path_factory.mktemp("one_device"))
  run(workdir, env, json.dumps(SGD))
  return final_params(workdir)[0]


@pytest.mark.parametrize("mode,fsdp", [
    ("mesh", 2),
    pytest.param("pmap", 1, marks=pytest.mark.slow),  # ~60 s; pmap mode also in test_parallel
])
def test_two_devices_match_one_device(tmp_path, env, reference_no_dropout, mode, fsdp):
  """The same loop on 2 fake CPU devices (a mesh with fsdp=2, or pmap) ends with the parameters
  of the 1-device run to 1e-5: each step's update is the same mean over all tokens. Dropout is off
  (pmap folds the device index into the dropout key, a different but equally valid mask), and
  the optimizer is SGD: Adam with eps 1e-9 turns float rounding noise on gradients that are
  mathematically zero (e.g. attention key biases) into full +-lr steps, which hides nothing
  but makes parameters incomparable; SGD at lr 0.1 keeps rounding differences near 1e-6 over 60
  steps (at lr 0.5 they grow to 1e-3: the dynamics amplify them). The tolerance covers float32
  summation order."""
  overrides = json.dumps({**SGD, "parallel.mode": mode,
                          "parallel.mesh_shape.fsdp": fsdp,
                          "parallel.mesh_shape.data": -1 if fsdp == 1 else 1})
  workdir = str(tmp_path / "two")
  run(workdir, dict(env, XLA_FLAGS=env.get("XLA_FLAGS", "") +
                    " --xla_force_host_platform_device_count=2"), overrides)
  import jax  # pylint: disable=g-import-not-at-top
  for a, b in zip(jax.tree.leaves(reference_no_dropout), jax.tree.leaves(final_params(workdir)[0])):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5)


def test_train_py_g2p_tiny_smoke_and_rerun(tmp_path, tmp_path_factory):
  """The product path: train.py on configs/g2p.py:tiny (shortened to 20 steps, on the whole CMUdict
  as prepared once for the suite by cmudict_data) exits 0 and leaves config.json, provenance.json,
  metrics.jsonl with train and eval (WER/PER) lines, TensorBoard events and the final checkpoint,
  warns in one line that its 20 steps end inside the warmup, and its last lines name the workdir and
  the eval, predict and TensorBoard commands; the same command again resumes the finished run
  instead of retraining (metrics.jsonl unchanged) and says so in one line before the same commands,
  with no library warning; its log lines are plain ('warning: ...'), without absl's prefix."""
  workdir = str(tmp_path / "g2p")
  data_dir = cmudict_data.prepared_data_dir(tmp_path_factory)
  cmd = [sys.executable, "train.py", "--config=configs/g2p.py:tiny", f"--workdir={workdir}",
         f"--config.data.data_dir={data_dir}",
         "--config.train.num_steps=20", "--config.train.log_every_steps=10",
         "--config.eval.every_steps=20", "--config.eval.num_decode_examples=16",
         "--config.eval.num_batches=2", "--config.checkpoint.every_steps=10"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  done, *last = proc.stdout.strip().splitlines()[-6:]
  assert done.startswith("done: step=20 ")
  assert last[:2] == [f"workdir: {workdir} (checkpoints, metrics.jsonl, TensorBoard events)",
                      "next:"]
  assert [line.split("#")[0].split()[1:] for line in last[2:4]] == [
      ["eval.py", f"--workdir={workdir}", "--split=test"],
      ["-m", "transformer.infer.predict", f"--workdir={workdir}"]]
  assert last[4].split() == ["tensorboard", f"--logdir={workdir}"]
  warned = [line for line in proc.stderr.splitlines() if "warmup" in line]  # 20 of 100 steps
  assert len(warned) == 1 and warned[0].startswith("warning: train.num_steps=20 <= "
                                                   "train.warmup_steps=100"), warned
  # Plain lines: no absl prefix ("I1129 03:04:34.752485 1398 task.py:66] "), no TFDS config note
  assert not re.search(r"^[IWEF]\d{4} \d\d:|WARNING:absl|Using custom data", proc.stderr,
                       re.M), proc.stderr[-3000:]
  files = os.listdir(workdir)
  for name in ("config.json", "provenance.json", "metrics.jsonl", "checkpoints"):
    assert name in files, name
  assert any(f.startswith("events.out.tfevents") for f in files)
  assert steps(workdir)[-1] == 20
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    before = f.read()
  records = [json.loads(line) for line in before.splitlines()]
  assert any("train/loss" in r for r in records)
  assert any("eval/wer" in r and "eval/per" in r for r in records)
  again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
  assert again.returncode == 0, again.stderr[-3000:]
  finished = f"{workdir} holds a finished run (step 20): nothing to train"
  assert again.stdout.splitlines() == [finished, *last]
  warned = [line for line in again.stderr.splitlines()
            if line.startswith(("W", "E", "warning:", "error:"))]
  assert not warned, again.stderr  # no orbax "read only" warnings, no warmup warning
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    assert f.read() == before
