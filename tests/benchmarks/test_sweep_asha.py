"""benchmarks/sweep_asha.py: its record's metrics from two sweeps' results, the record's schema,
and (slow) its smoke size run end to end."""

import json
import os
import subprocess
import sys
import types

import pytest

from bench_loader import REPO, load_benchmark
from record_schema import OPTIONAL, REQUIRED

sweep_asha = load_benchmark("sweep_asha")


def write_point(workdir, name, steps, logged):
  """metrics.jsonl logging `logged` steps, a checkpoint at `steps` (saved where it stopped)."""
  os.makedirs(os.path.join(workdir, name, "checkpoints", str(steps)))
  with open(os.path.join(workdir, name, "metrics.jsonl"), "w") as f:
    for s in range(1, logged + 1):
      f.write(json.dumps({"step": s, "train/loss": 1.0 / s}) + "\n")
    f.write(json.dumps({"step": logged, "eval/wer": 0.5}) + "\n")
    f.write('{"step": 99, "train/lo')  # a line cut by a kill is skipped


def test_record_compares_best_wers_and_counts_trained_steps(tmp_path):
  """The trained steps of a point are its newest checkpoint or last logged step, whichever is
  later; the record's fraction is ASHA's steps over the grid's, the gap ASHA's best dev WER minus
  the grid's in points, the stopped points those whose status says so; the record has exactly
  the schema's keys."""
  for name, steps, logged in (("a", 8, 8), ("b", 6, 8)):
    write_point(tmp_path / "grid", name, steps, logged)
  for name, steps, logged in (("a", 8, 8), ("b", 3, 2)):
    write_point(tmp_path / "asha", name, steps, logged)
  grid = {"command": "g", "wall_clock_s": 10.0, "best_dev_wer": 0.40,
          "rows": [{"point": "a", "status": "done"}, {"point": "b", "status": "done"}],
          "steps": {n: sweep_asha.trained_steps(str(tmp_path / "grid" / n)) for n in "ab"}}
  asha = {"command": "a", "wall_clock_s": 6.0, "best_dev_wer": 0.403,
          "rows": [{"point": "a", "status": "done"},
                   {"point": "b", "status": "stopped by asha at step 2"}],
          "steps": {n: sweep_asha.trained_steps(str(tmp_path / "asha" / n)) for n in "ab"}}
  assert grid["steps"] == {"a": 8, "b": 8} and asha["steps"] == {"a": 8, "b": 3}
  args = types.SimpleNamespace(learning_rates=[1e-3, 1e-2], seeds=[0])
  record = sweep_asha.record(args, ["--config.eval.every_steps=2"], grid, asha, 16.0)
  m = record["metrics"]
  assert m["asha_step_fraction"] == pytest.approx(11 / 16) and m["grid_steps"] == 16
  assert m["wer_gap_points"] == pytest.approx(0.3) and m["asha_points_stopped"] == 1
  assert (m["grid_best_dev_wer"], m["asha_best_dev_wer"]) == (40.0, 40.3)  # percent
  assert set(record) <= set(REQUIRED) | set(OPTIONAL) and set(REQUIRED) <= set(record)
  assert all(isinstance(record[k], t) for k, t in REQUIRED.items())
  assert sweep_asha.raw(grid, asha)["asha"]["steps"] == {"a": 8, "b": 3}
  # --record_only makes the same metrics again from sweeps.json, keeping the command and commit.
  out = tmp_path / "sweep_asha"
  out.mkdir()
  for a, b in ((grid, "0.40"), (asha, "0.403")):
    a["rows"][0]["dev/wer"] = b
  sweep_asha.write_json(str(out / "sweeps.json"), sweep_asha.raw(grid, asha))
  sweep_asha.write_json(str(out / "record.json"), record | {"commit": "abc", "metrics": {}})
  again = sweep_asha.rebuilt(args, str(out))
  assert again["metrics"] == m and again["commit"] == "abc"


@pytest.mark.slow  # ~6 min on 2 cores: two sweeps of two real :tiny points
def test_smoke_size_runs_and_writes_its_record(tmp_path):
  """The docstring's smoke command (2 points, 8 steps) runs both sweeps and writes a record whose
  useless learning rate ASHA stopped, using fewer steps than the grid."""
  out = tmp_path / "out"
  cmd = [sys.executable, "benchmarks/sweep_asha.py", f"--workdir={tmp_path / 'w'}", f"--out={out}",
         "--learning_rates=5e-3,1e-9", "--seeds=0", "--parallel=1", "--config.train.num_steps=8",
         "--config.eval.every_steps=2", "--config.eval.num_batches=1",
         "--config.eval.num_decode_examples=8", "--config.checkpoint.every_steps=2",
         "--asha_metric=eval/loss"]
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800, check=False,
                        env=dict(os.environ, PYTHONPATH=REPO))
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  record = json.load(open(out / "sweep_asha" / "record.json"))
  assert record["metrics"]["asha_points_stopped"] == 1
  assert record["metrics"]["asha_step_fraction"] < 1.0
