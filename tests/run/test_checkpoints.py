"""Tests for transformer/run/checkpoints.py: round trips, retention, tmp dirs, compatibility, preemption."""

import dataclasses
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import base
from transformer import cli, config as config_lib, schema
from transformer.config import ConfigError, from_configdict, to_dict
from transformer.run import checkpoints, digests, orbax_teardown, restore
from transformer.train import preemption

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ckpt_cfg(**overrides):
  """The validated checkpoint section of base.py with overrides."""
  return dataclasses.replace(from_configdict(base.get_config()).checkpoint, **overrides)


def config_dict(**model_overrides):
  """A full config as a plain dict (what the training loop stores), with model overrides."""
  c = base.get_config()
  c.model.update(model_overrides)
  return to_dict(from_configdict(c))


def toy_state(seed=0):
  """A train-state-like pytree: float32/bfloat16/int32 params, Adam state and a step counter."""
  k1, k2 = jax.random.split(jax.random.key(seed))
  params = {"dense": {"kernel": jax.random.normal(k1, (4, 3)),
                      "bias": jax.random.normal(k2, (3,)).astype(jnp.bfloat16)},
            "ids": jnp.arange(5, dtype=jnp.int32)}
  opt_state = optax.adam(1e-3).init(params)
  return {"params": params, "opt_state": opt_state, "step": jnp.asarray(7, jnp.int32)}


def assert_bitwise_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape
    assert x.tobytes() == y.tobytes()


def test_round_trip_is_bitwise_with_meta(tmp_path):
  """An async save restores bit for bit (dtypes kept); meta holds the config and the metrics."""
  state = toy_state()
  cfg = config_dict(d_model=64)
  ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(every_steps=10), config=cfg)
  assert ckpt.save(10, state, metrics={"eval/loss": np.float32(1.5), "train/loss": 2.0})
  ckpt.wait()
  restored = ckpt.restore(10, checkpoints.abstract_of(state))
  assert_bitwise_equal(restored, state)
  meta = ckpt.metadata()
  assert meta["step"] == 10 and meta["metrics"] == {"eval/loss": 1.5, "train/loss": 2.0}
  assert meta["config"]["model"]["d_model"] == 64
  ckpt.close()


def test_save_schedule_and_duplicates(tmp_path):
  """save() saves only at multiples of every_steps unless forced, and never re-saves a step."""
  ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(every_steps=5, keep=10))
  state = toy_state()
  assert [ckpt.save(s, state) for s in range(1, 11)] == [False] * 4 + [True] + [False] * 4 + [True]
  assert ckpt.save(12, state, force=True)
  assert not ckpt.save(12, state, force=True)  # a SIGTERM save right after a periodic one
  ckpt.close()
  assert ckpt.all_steps() == [5, 10, 12]


def test_latest_kept_even_when_not_best_and_best_kept(tmp_path):
  """keep=2 + best-by-min keeps the 2 newest and the lowest loss; the newest survives a bad loss."""
  ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(every_steps=1, keep=2, async_save=False))
  state = toy_state()
  losses = [5.0, 1.0, 4.0, 3.0, 6.0, float("nan")]
  for step, loss in enumerate(losses, start=1):
    ckpt.save(step, state, metrics={"eval/loss": loss})
  assert ckpt.all_steps() == [2, 5, 6]
  assert ckpt.latest_step() == 6 and ckpt.best_step() == 2  # NaN never ranks best
  ckpt.save(7, state)  # no eval metric at this step: counts only toward "latest"
  ckpt.save(8, state)
  assert ckpt.all_steps() == [2, 7, 8] and ckpt.best_step() == 2
  ckpt.close()
  reopened = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(keep=2))
  assert reopened.latest_step() == 8 and reopened.best_step() == 2  # metrics persist on disk
  reopened.close()


def test_best_by_max_and_no_best(tmp_path):
  """best_mode=max keeps the highest value; keep_best_by='' keeps only the latest K."""
  ckpt = checkpoints.Checkpointer(str(tmp_path / "a"), ckpt_cfg(
      every_steps=1, keep=1, keep_best_by="eval/accuracy", best_mode="max", async_save=False))
  for step, acc in enumerate([0.2, 0.9, 0.5], start=1):
    ckpt.save(step, toy_state(), metrics={"eval/accuracy": acc})
  assert ckpt.all_steps() == [2, 3] and ckpt.best_step() == 2
  ckpt.close()
  ckpt = checkpoints.Checkpointer(str(tmp_path / "b"), ckpt_cfg(
      every_steps=1, keep=2, keep_best_by="", async_save=False))
  for step, loss in enumerate([0.1, 0.9, 0.5], start=1):
    ckpt.save(step, toy_state(), metrics={"eval/loss": loss})
  assert ckpt.all_steps() == [2, 3] and ckpt.best_step() is None
  ckpt.close()


def test_interrupted_save_tmp_dir_is_ignored(tmp_path):
  """A half-written `<step>.orbax-checkpoint-tmp-*` dir is not a step and is removed by the next manager."""
  ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(every_steps=1))
  state = toy_state()
  ckpt.save(4, state)
  ckpt.close()
  tmp = os.path.join(ckpt.directory, "6.orbax-checkpoint-tmp-1234567")
  shutil.copytree(os.path.join(ckpt.directory, "4"), tmp)  # what a SIGKILL mid-save leaves
  reopened = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(every_steps=1))
  assert reopened.latest_step() == 4 and reopened.all_steps() == [4]
  assert_bitwise_equal(reopened.restore(None, checkpoints.abstract_of(state)), state)
  assert reopened.save(6, state)  # orbax awaits its background tmp-dir cleanup before saving
  reopened.close()
  assert not os.path.exists(tmp) and reopened.all_steps() == [4, 6]


def test_async_save_committed_after_wait_with_iterator_position(tmp_path):
  """After wait() a fresh Checkpointer sees the step; the Grain position is that of save time."""
  ds = grain.MapDataset.range(40).batch(2).to_iter_dataset()
  it = iter(ds)
  for _ in range(3):
    next(it)
  ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(every_steps=1))
  big = {"w": jnp.arange(200_000, dtype=jnp.float32), "step": jnp.asarray(3)}
  assert ckpt.save(3, big, data_iterator=it)
  expected_next = next(it)  # the iterator moves on while the save completes in the background
  next(it)
  ckpt.wait()
  fresh = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(every_steps=1))
  assert fresh.latest_step() == 3
  assert not [d for d in os.listdir(fresh.directory) if "tmp" in d]
  it2 = iter(ds)
  restored = fresh.restore(3, checkpoints.abstract_of(big), data_iterator=it2)
  assert_bitwise_equal(restored, big)
  np.testing.assert_array_equal(next(it2), expected_next)
  fresh.close()
  ckpt.close()


def test_check_compatible_names_first_differing_model_key(tmp_path):
  """A workdir holding d_model=256 rejects a d_model=512 config with a one-line message."""
  workdir = str(tmp_path / "x")
  checkpoints.check_compatible(workdir, config_dict())  # empty workdir: nothing to check
  ckpt = checkpoints.Checkpointer(workdir, ckpt_cfg(), config=config_dict(d_model=256))
  ckpt.save(1, toy_state(), force=True)
  ckpt.close()
  with pytest.raises(checkpoints.CheckpointError) as err:
    checkpoints.check_compatible(workdir, config_dict(d_model=512, num_heads=4))
  msg = str(err.value)
  assert "\n" not in msg
  assert f"workdir {workdir} holds a run with model.d_model=256, this config has 512" in msg
  # Dropout or compute dtype may change on resume; derived sizes written 0 are not compared.
  checkpoints.check_compatible(workdir, config_dict(d_model=256, dropout_rate=0.3,
                                                    dtype="bfloat16"))
  raw = base.get_config()
  raw.model.d_model = 256
  checkpoints.check_compatible(workdir, raw)  # ConfigDict with head_dim=0 etc.


@pytest.mark.parametrize("key,old,new", [
    ("sliding_window", 0, 16), ("moe_capacity_factor", 1.25, 2.0), ("moe_top_k", 2, 1),
    ("rope_base", 10000.0, 500000.0), ("norm_eps", 1e-6, 1e-5)])
def test_resume_refuses_a_key_that_changes_the_function_of_the_weights(tmp_path, key, old, new):
  """A resume may not change a model key that keeps the train state's structure but changes
  what the weights compute (the window, MoE routing and capacity, RoPE, ...): schema roles
  decide (every model key but those of role eval or finetune), not a list."""
  workdir = str(tmp_path / "x")
  os.makedirs(workdir)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(config_dict(**{key: old}), f)
  with pytest.raises(checkpoints.CheckpointError, match=rf"model\.{key}={old!r}, this config "
                     rf"has {new!r}"):
    checkpoints.check_compatible(workdir, config_dict(**{key: new}))
  kept = schema.kept_on_resume()
  assert f"model.{key}" in kept and "model.d_model" in kept and "train.optimizer" in kept
  free = {"model.dropout_rate", "model.dtype", "model.remat", "model.attention_impl"}
  assert not free & set(kept)


def test_check_compatible_falls_back_to_config_json(tmp_path):
  """Without checkpoints, workdir/config.json is compared (e.g. a different optimizer)."""
  import json  # pylint: disable=g-import-not-at-top
  with open(tmp_path / "config.json", "w") as f:
    json.dump(config_dict(), f)
  c = base.get_config()
  c.train.optimizer = "sgd"
  with pytest.raises(checkpoints.CheckpointError, match=r"train\.optimizer='adam', this config "
                     r"has 'sgd'"):
    checkpoints.check_compatible(str(tmp_path), c)


def test_restore_into_wrong_structure_is_one_line_error(tmp_path):
  """Restoring into a differently shaped state raises CheckpointError, not a deep orbax error."""
  ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg())
  ckpt.save(1, {"w": jnp.ones((4, 3))}, force=True)
  with pytest.raises(checkpoints.CheckpointError, match="cannot restore"):
    ckpt.restore(1, {"w": jax.ShapeDtypeStruct((4, 3), jnp.float32),
                     "extra": jax.ShapeDtypeStruct((2,), jnp.float32)})
  with pytest.raises(checkpoints.CheckpointError, match="no checkpoint for step 5"):
    ckpt.restore(5, {"w": jax.ShapeDtypeStruct((4, 3), jnp.float32)})
  ckpt.close()
  bad = base.get_config()
  bad.checkpoint.keep = 0  # the schema refuses it before any Checkpointer is built
  with pytest.raises(ConfigError, match=r"checkpoint\.keep=0 must be > 0"):
    from_configdict(bad)


def test_restore_from_8_devices_onto_1(tmp_path):
  """A state saved sharded over 8 fake devices (subprocess) restores bitwise onto this 1 device."""
  script = textwrap.dedent(f"""
      import jax, jax.numpy as jnp, numpy as np
      jax.config.update("jax_num_cpu_devices", 8)
      from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
      from transformer.run import checkpoints
      from tests.run.test_checkpoints import ckpt_cfg
      mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "tensor"))
      state = {{"w": jax.device_put(jnp.arange(64.0).reshape(8, 8),
                                     NamedSharding(mesh, P("data", "tensor"))),
                "b": jax.device_put(jnp.arange(8, dtype=jnp.int32), NamedSharding(mesh, P()))}}
      assert len(state["w"].sharding.device_set) == 8
      ckpt = checkpoints.Checkpointer({str(tmp_path)!r}, ckpt_cfg())
      ckpt.save(2, state, force=True)
      ckpt.close()
  """)
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = {"w": jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=device),
              "b": jax.ShapeDtypeStruct((8,), jnp.int32, sharding=device)}
  ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg())
  restored = ckpt.restore(None, abstract)
  ckpt.close()
  assert restored["w"].sharding == device
  assert_bitwise_equal(restored, {"w": np.arange(64.0, dtype=np.float32).reshape(8, 8),
                                  "b": np.arange(8, dtype=np.int32)})


def test_sigterm_sets_the_preemption_flag():
  """SIGTERM sets .requested / should_stop instead of killing the process; uninstall restores."""
  before = signal.getsignal(signal.SIGTERM)
  handler = preemption.install_preemption_handler()
  try:
    assert not handler.should_stop(0)
    os.kill(os.getpid(), signal.SIGTERM)
    assert handler.requested and handler.should_stop(1) and handler.signum == signal.SIGTERM
  finally:
    handler.uninstall()
  assert signal.getsignal(signal.SIGTERM) == before


def test_sigkill_during_async_saves_leaves_a_restorable_latest(tmp_path):
  """A process SIGKILLed while saving every step leaves a latest step that restores exactly.

  The child saves {'w': full(n, step)} asynchronously every step; whatever moment the kill hits,
  the latest complete step on disk must restore to the values of that very step.
  """
  script = textwrap.dedent(f"""
      import sys, jax.numpy as jnp
      from transformer.run import checkpoints
      from tests.run.test_checkpoints import ckpt_cfg
      ckpt = checkpoints.Checkpointer({str(tmp_path)!r}, ckpt_cfg(every_steps=1, keep=2))
      for step in range(1, 10_000):
        ckpt.save(step, {{"w": jnp.full((100_000,), step, jnp.float32)}})
        print(step, flush=True)
  """)
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
  try:
    for line in proc.stdout:
      if int(line) >= 6:
        break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
  ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(every_steps=1, keep=2))
  latest = ckpt.latest_step()
  assert latest is not None and latest >= 5
  restored = ckpt.restore(None, {"w": jax.ShapeDtypeStruct((100_000,), jnp.float32)})
  np.testing.assert_array_equal(np.asarray(restored["w"]), np.full((100_000,), latest, np.float32))
  ckpt.close()


def test_best_step_is_none_without_the_metric(tmp_path):
  """Checkpoints without the best-by metric never count as best; retention stays latest K."""
  ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(every_steps=1, keep=2, async_save=False))
  for step in range(1, 5):
    ckpt.save(step, toy_state(), metrics={"train/loss": 1.0 / step} if step % 2 else None)
  assert ckpt.all_steps() == [3, 4] and ckpt.best_step() is None
  ckpt.close()


def test_a_run_saved_in_another_config_format_is_one_line(tmp_path):
  """config.json carries config.FORMAT; one without it (or with another) is refused in one line
  naming the file and both formats, by evaluation and by a resume into that workdir."""
  saved = to_dict(from_configdict(base.get_config()))
  assert saved["format"] == config_lib.FORMAT
  (tmp_path / "config.json").write_text(json.dumps(saved))
  assert restore.load_run_config(str(tmp_path)).model.d_model == saved["model"]["d_model"]
  del saved["format"]
  (tmp_path / "config.json").write_text(json.dumps(saved))
  message = f"config format 0; this code reads format {config_lib.FORMAT}"
  with pytest.raises(restore.EvaluationError, match=message) as info:
    restore.load_run_config(str(tmp_path))
  assert str(tmp_path / "config.json") in str(info.value) and "\n" not in str(info.value)
  with pytest.raises(checkpoints.CheckpointError, match=message):
    checkpoints.check_compatible(str(tmp_path), base.get_config())


# ----------------------------------------------------------------------------- faults while saving


def test_a_save_whose_directory_cannot_be_made_fails_at_once(tmp_path):
  """A checkpoints directory that stops accepting writes after a save (replaced by a regular
  file: root ignores permission bits) fails the next save within seconds naming the path,
  instead of orbax's background threads waiting minutes for a directory that never comes."""
  ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(every_steps=1))
  ckpt.save(1, toy_state())
  ckpt.wait()
  os.rename(ckpt.directory, str(tmp_path / "kept"))
  open(ckpt.directory, "w").close()
  outcome = []

  def save():
    try:
      ckpt.save(2, toy_state())
    except Exception as e:  # pylint: disable=broad-except
      outcome.append(e)

  thread = threading.Thread(target=save, daemon=True)
  thread.start()
  thread.join(timeout=30)
  assert not thread.is_alive(), "the save hangs"
  assert isinstance(outcome[0], OSError) and str(tmp_path / "checkpoints" / "2") in str(outcome[0])
  ckpt.close()
  assert os.listdir(tmp_path / "kept") == ["1"]


def test_a_failed_async_save_is_raised_once_at_the_next_check(tmp_path):
  """A background save that fails (here: the disk is full) is raised by check_saves, which the
  loop calls every dispatch, as one CheckpointError naming the step, reason and the kept steps;
  closing afterwards does not raise it again."""
  ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(every_steps=1))
  ckpt.save(1, toy_state())
  ckpt.wait()
  real_wait = ckpt._manager.wait_until_finished

  def full_disk():  # the background save of step 2 fails (its digest thread sees it)
    real_wait()
    if threading.current_thread().name == "checkpoint-digest-2":
      raise OSError(errno.ENOSPC, "No space left on device")

  ckpt._manager.wait_until_finished = full_disk
  ckpt.save(2, toy_state())
  ckpt._join_digest()
  with pytest.raises(checkpoints.CheckpointError) as e:
    ckpt.check_saves()
  assert str(e.value).startswith(f"checkpoint {ckpt.directory}/2 could not be saved: OSError: "
                                 "[Errno 28] No space left on device; the committed checkpoints")
  assert cli.error_line(e.value) == (
      f"{ckpt.directory}/2: No space left on device; free some space, then rerun the same "
      "command (committed checkpoints are kept)")
  ckpt.check_saves()  # once
  ckpt.close()


def test_a_symlinked_step_is_kept_by_retention(tmp_path, caplog):
  """A step directory that is a symbolic link is named in one line when training opens the
  directory, read as any step, and never deleted by checkpoint.keep (orbax's rmtree refuses a
  link, which failed the save and left the new step without its digest)."""
  ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(every_steps=1, keep=1))
  ckpt.save(1, toy_state())
  ckpt.close()
  step1 = os.path.join(ckpt.directory, "1")
  shutil.move(step1, str(tmp_path / "elsewhere"))
  os.symlink(str(tmp_path / "elsewhere"), step1)
  with caplog.at_level("WARNING"):
    ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(every_steps=1, keep=1))
  assert any(f"checkpoint {step1} is a symbolic link" in r.getMessage() for r in caplog.records)
  for step in (2, 3):
    ckpt.save(step, toy_state())
  ckpt.close()
  assert os.path.islink(step1) and ckpt.all_steps() == [1, 3]
  assert digests.verify_step(os.path.join(ckpt.directory, "3")) is None


@pytest.mark.parametrize("name", ["_CHECKPOINT_METADATA", "metrics/metrics", "state/_METADATA",
                                  "meta/metadata"])
def test_damaged_orbax_metadata_of_an_older_step_is_verified_first(tmp_path, name):
  """Truncated orbax metadata of an older step: a reader refuses in one line naming the file and
  the step and offering the newest good one (orbax raised a JSONDecodeError at listing); a writer
  moves the step aside to <step>.corrupt and goes on."""
  ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(every_steps=1, keep=3,
                                                          keep_best_by="eval/loss"))
  for step in (1, 2):
    ckpt.save(step, toy_state(), metrics={"eval/loss": 1.0})
  ckpt.close()
  path = os.path.join(ckpt.directory, "1", name)
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)
  with pytest.raises(checkpoints.CheckpointError) as e:
    checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(keep_best_by="eval/loss"), read_only=True)
  assert str(e.value).startswith(
      f"checkpoint {ckpt.directory}/1 fails verification ({name} does not match its digest); "
      "the newest checkpoint that verifies is step 2"), str(e.value)
  writer = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(keep_best_by="eval/loss"))
  assert writer.all_steps() == [2] and os.path.isdir(os.path.join(ckpt.directory, "1.corrupt"))
  writer.close()


def test_the_orbax_teardown_fix_refuses_an_orbax_it_was_not_checked_on(monkeypatch):
  """orbax_teardown wraps a private orbax function: on another orbax version it raises one
  line naming the version and what to check, never silently patches or skips."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(ocp, "__version__", "0.13.0")
  with pytest.raises(RuntimeError, match=r"orbax-checkpoint 0.13.0: .*checked on 0.12.x only"):
    orbax_teardown.finish_writes_first()
  monkeypatch.undo()  # the checked version: installed once, idempotent
  orbax_teardown.finish_writes_first()
