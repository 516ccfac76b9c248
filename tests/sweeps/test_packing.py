"""Packing a sweep's points into train.members programs (transformer/sweeps/packing.py): the
grouping, the dry run, the run with a fake trainer (packs, evaluations, a failed pack rerun, a
point finished alone not rerun), and a real :tiny sweep packed, interrupted and resumed, against
the same points trained alone."""

import json
import os
import sys
import time

import pytest

from sweep_fixtures import (  # noqa: F401  (fake: a fixture)
    FAKE_PACK_TRAIN, TINY, fake, load_config_file, recording, write_sweep)
from transformer.sweeps import packing, report, runner, spec, watch

BASE = {"parallel.mode": "mesh", "train.early_stop_patience": 0, "train.members": "",
        "seed": 0, "train.learning_rate": 1e-3, "train.warmup_steps": 10, "model.d_model": 16,
        "train.num_steps": 100}


def _flat(**changes):
  return BASE | {k.replace("__", "."): v for k, v in changes.items()}


@pytest.mark.parametrize("configs, starts, limit, groups", [
    # seeds only: one pack, or packs of `limit` in order
    ([_flat(seed=i) for i in range(4)], [None] * 4, 4, [[0, 1, 2, 3]]),
    ([_flat(seed=i) for i in range(5)], [None] * 5, 2, [[0, 1], [2, 3], [4]]),
    # a structural key apart: two packs, each in the file's order
    ([_flat(seed=0), _flat(seed=0, model__d_model=32), _flat(seed=1),
      _flat(seed=1, model__d_model=32)], [None] * 4, 8, [[0, 2], [1, 3]]),
    # every member key may differ within a pack
    ([_flat(), _flat(train__learning_rate=3e-3, train__warmup_steps=0), _flat(train__b1=0.8),
      _flat(train__grad_clip=1.0, train__weight_decay=0.1, train__z_loss=1e-4),
      _flat(model__dropout_rate=0.2, train__label_smoothing=0.0)], [None] * 5, 8,
     [[0, 1, 2, 3, 4]]),
    # train.num_steps is structure
    ([_flat(seed=0), _flat(seed=1, train__num_steps=50)], [None] * 2, 8, [[0], [1]]),
    # points at different checkpoint steps never share a pack
    ([_flat(seed=i) for i in range(4)], [None, 20, None, 20], 8, [[0, 2], [1, 3]]),
    # pmap, early stopping and a point that is itself a members run train alone
    ([_flat(seed=0, parallel__mode="pmap"), _flat(seed=1, parallel__mode="pmap")], [None] * 2, 8,
     [[0], [1]]),
    ([_flat(seed=0, train__early_stop_patience=3), _flat(seed=1, train__early_stop_patience=3)],
     [None] * 2, 8, [[0], [1]]),
    ([_flat(seed=0, train__members="seeds:2"), _flat(seed=5)], [None] * 2, 8, [[0], [1]]),
    # equal configs (the same run twice) are never members of one program
    ([_flat(), _flat(), _flat(seed=1)], [None] * 3, 8, [[0, 2], [1]]),
    # --pack=1: nothing packed
    ([_flat(seed=i) for i in range(3)], [None] * 3, 1, [[0], [1], [2]]),
    # a key no member may vary keeps apart points that also differ in member keys
    ([_flat(seed=0, train__learning_rate=1e-3), _flat(seed=1, model__d_model=8)], [None] * 2, 8,
     [[0], [1]]),
])
def test_grouping(configs, starts, limit, groups):
  """group() packs configs that differ only in MEMBER_KEYS and start at one step, <= limit each."""
  assert packing.group(configs, starts, limit) == groups


def test_varying_keys_in_member_keys_order():
  """varying() names the member keys that differ, in MEMBER_KEYS' order."""
  assert packing.varying([_flat(), _flat(seed=1, train__b2=0.9, train__learning_rate=2e-3)]) == [
      "seed", "train.learning_rate", "train.b2"]


@pytest.fixture
def packed(fake, tmp_path):
  """The fake fixture's three lr points with a trainer that also trains train.members packs."""
  points, commands = fake
  (tmp_path / "fake_pack_train.py").write_text(FAKE_PACK_TRAIN)
  commands = spec.Commands(commands.config_arg, commands.base_overrides, python=sys.executable,
                           train_script=str(tmp_path / "fake_pack_train.py"),
                           eval_script=commands.eval_script)
  config = spec.apply_overrides(load_config_file(TINY), {"train.num_steps": 3})
  return config, points, commands, str(tmp_path / "w")


def test_dry_run_prints_the_grouping(packed):
  """The dry run names each pack's points, the keys its members differ in, its command (the
  varying key only in train.members) and each point's evaluation; the rest as runner's."""
  config, points, commands, workdir = packed
  packs, alone = packing.plan(config, points, commands, 2, workdir)
  assert [[p.name for p in k.points] for k in packs] == [["lr=0.5", "lr=1.0"]]
  assert [p.name for p in alone] == ["lr=2.0"]
  lines = packing.dry_run_lines(packs, alone, points, commands, 2)
  assert lines[0] == "# --pack=2: 2 points to train in 1 pack(s), 1 alone"
  assert lines[1].startswith(f"# {packs[0].name}: lr=0.5, lr=1.0 (members differ in "
                             "train.learning_rate;")
  assert "'--config.train.members=train.learning_rate=0.5;train.learning_rate=1.0'" in lines[2]
  assert "--config.train.learning_rate" not in lines[2]
  assert lines[3:5] == [" ".join(commands.eval(p)) for p in points[:2]]
  assert lines[5] == "# lr=2.0: new"
  assert lines[-1].startswith("# 3 points: 2 training runs to start (")
  assert lines[-1].endswith(", 3 evaluations, 0 points done")
  only_packs = packing.dry_run_lines(packs, [], points[:2], commands, 2)  # nothing alone
  assert only_packs[-1].startswith("# 2 points: 1 training runs to start (")


def test_packed_run_trains_packs_evaluates_points_and_reruns_only_what_failed(packed):
  """A packed run trains the pack in one process (each point's files in its own workdir via the
  pack's links), evaluates each point, trains the odd point alone; the report has three done
  rows. A pack that fails is reported for each of its points and not retrained alone; the rerun
  retrains that same pack (same name and workdir) and then starts nothing."""
  config, points, commands, workdir = packed
  calls, lines = [], []
  console = watch.Console(lines.append)
  pack = packing.plan(config, points, commands, 2, workdir)[0][0]
  os.makedirs(pack.workdir)
  open(os.path.join(pack.workdir, "FAIL_ONCE"), "w").close()
  failed = packing.run(config, points, commands, 2, workdir, launch=recording(calls),
                       console=console)
  assert [p.name for p in failed] == ["lr=0.5", "lr=1.0"]
  assert calls == [pack.train_argv(commands), commands.train(points[2]), commands.eval(points[2])]
  assert runner.read_record(points[0])["attempts"][-1] | {"seconds": 0, "finished": ""} == {
      "stage": "train", "pack": pack.name, "argv": pack.train_argv(commands), "returncode": 3,
      "seconds": 0, "finished": ""}
  log = os.path.join(pack.workdir, runner.LOG)
  assert f"lr=1.0: FAILED (train, exit code 3), see {log}" in lines, lines
  calls.clear()
  assert packing.run(config, points, commands, 2, workdir, launch=recording(calls),
                     console=console) == []
  assert calls == [pack.train_argv(commands), commands.eval(points[0]), commands.eval(points[1])]
  for p in points:
    assert runner.status(p, commands) == "done"
    assert os.path.isfile(os.path.join(p.workdir, "metrics.test.json"))
  assert os.path.islink(os.path.join(pack.workdir, "train.learning_rate=0.5"))
  assert runner.read_record(points[1])["pack"] == pack.name
  rows = report.collect(points)
  assert [r["status"] for r in rows] == ["done"] * 3
  assert [r["test/wer"] for r in rows] == [0.1, 0.2, 0.4]  # fake eval: 2 * lr / 10
  calls.clear()
  assert packing.run(config, points, commands, 2, workdir, launch=recording(calls),
                     console=console) == []
  assert calls == []


def test_a_packed_points_finished_line_counts_its_packs_training(packed, monkeypatch):
  """A packed point's 'finished in' is its pack's training plus its own evaluation (81 s + 11 s
  on a fake clock), not its evaluation alone."""
  config, points, commands, workdir = packed
  clock, lines = [1000.0], []
  monkeypatch.setattr(time, "time", lambda: clock[0])

  def launch(argv, log_path, cwd):
    clock[0] += 81 if any(a.startswith("--config.train.members=") for a in argv) else 11
    return runner.launch_subprocess(argv, log_path, cwd)

  assert packing.run(config, points[:2], commands, 2, workdir, launch=launch,
                     console=watch.Console(lines.append)) == []
  assert any(line.endswith(": trained in 1:21") for line in lines), lines
  finished = [line for line in lines if ": finished in " in line]
  assert len(finished) == 2 and all(": finished in 1:32," in line for line in finished), lines


def test_a_point_finished_alone_leaves_its_pack(packed):
  """A point trained unpacked before the packed run is not rerun (its record untouched): the
  other two form the pack."""
  config, points, commands, workdir = packed
  assert runner.run(points[:1], commands, echo=lambda line: None) == []
  record = runner.read_record(points[0])
  packs, alone = packing.plan(config, points, commands, 3, workdir)
  assert [[p.name for p in k.points] for k in packs] == [["lr=1.0", "lr=2.0"]] and alone == []
  calls = []
  assert packing.run(config, points, commands, 3, workdir, launch=recording(calls),
                     console=watch.Console(lambda line: None)) == []
  assert calls == [packs[0].train_argv(commands), commands.eval(points[1]),
                   commands.eval(points[2])]
  assert runner.read_record(points[0]) == record


REAL = {  # a 1+1-layer d=16 :tiny, 4 steps, an in-training evaluation at steps 2 and 4
    "train.num_steps": 4, "train.log_every_steps": 1, "eval.every_steps": 2,
    "checkpoint.every_steps": 2, "eval.num_batches": 1, "eval.num_decode_examples": 4,
    "train.schedule": "constant", "train.warmup_steps": 0,
    "data.batch_size": 8, "data.max_source_len": 12, "data.max_target_len": 12,
    "model.d_model": 16, "model.num_heads": 2, "model.mlp_dim": 32,
    "model.num_encoder_layers": 1, "model.num_decoder_layers": 1}
REAL_SWEEP = ('def get_sweep():\n  return [{"seed": 0}, {"seed": 1}, {"seed": 2, '
              '"train.learning_rate": 2e-3, "train.b2": 0.95}]\n')


def _logged(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return {(r["step"], k): v for r in rows for k, v in r.items()
          if k in ("train/loss", "train/grad_norm", "eval/loss", "eval/per")}


@pytest.mark.slow  # ~3 min on 2 cores: five real train.py processes
def test_real_packed_sweep_resumes_and_equals_its_points_trained_alone(tmp_path, monkeypatch):
  """On :tiny (real train.py): a point trained alone first is not rerun by the packed sweep;
  the other two train as one pack, which is stopped after its step-2 checkpoint (as a preempted
  run) and resumed by the rerun as the same pack to step 4; every logged train loss, grad norm
  and in-training evaluation of the packed points equals the same points trained alone (1e-5)."""
  import g2p_mini  # pylint: disable=g-import-not-at-top
  files = g2p_mini.write_files(str(tmp_path / "data"), num_train=200, num_test=16)
  overrides = REAL | {f"data.{k}": v for k, v in files.items()} | {
      "data.data_dir": str(tmp_path / "tfds")}
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax_cache"))
  monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  config = spec.apply_overrides(load_config_file(TINY), overrides)
  path = write_sweep(tmp_path, REAL_SWEEP)
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  commands = spec.Commands(TINY, overrides, python=sys.executable, eval_split="", cwd=root,
                           train_script=os.path.join(root, "train.py"))
  quiet = watch.Console(lambda line: None)
  points = spec.plan(config, TINY, path, str(tmp_path / "packed"))
  assert runner.run(points[:1], commands, console=quiet) == []
  record = runner.read_record(points[0])

  def preempted(argv, log_path, cwd):  # stops after step 2, as a SIGTERM'd run that saved
    argv = [a.replace("--config.train.num_steps=4", "--config.train.num_steps=2") for a in argv]
    return runner.launch_subprocess(argv, log_path, cwd)

  workdir = str(tmp_path / "packed")
  pack = packing.plan(config, points, commands, 3, workdir)[0][0]
  assert [p.name for p in pack.points] == [p.name for p in points[1:]]
  assert packing.run(config, points, commands, 3, workdir, launch=preempted,
                     console=quiet) == points[1:]
  assert all(runner.latest_checkpoint(p) == 2 for p in points[1:])
  calls = []
  assert packing.run(config, points, commands, 3, workdir, launch=recording(calls),
                     console=quiet) == []
  assert calls == [pack.train_argv(commands)]  # the same pack resumed; point 0 not rerun
  assert runner.read_record(points[0]) == record
  alone = spec.plan(config, TINY, path, str(tmp_path / "alone"))
  assert runner.run(alone[1:], commands, console=quiet) == []
  for p, q in zip(points[1:], alone[1:]):
    mine, theirs = _logged(p.workdir), _logged(q.workdir)
    assert sorted(mine) == sorted(theirs) and (4, "eval/loss") in mine
    for key, value in theirs.items():
      assert mine[key] == pytest.approx(value, abs=1e-5), (p.name, key)
  assert abs(_logged(points[1].workdir)[4, "train/loss"]
             - _logged(points[2].workdir)[4, "train/loss"]) > 1e-4
