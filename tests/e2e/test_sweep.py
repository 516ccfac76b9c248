"""One real `:tiny` sweep: runs, reruns nothing, reports."""

import csv

import pytest
from sweep_fixtures import TINY, sweep_cli, write_sweep
from transformer.sweeps import runner


TINY_OVERRIDES = {  # a 1+1-layer d=16 model, 2 steps, one eval batch, 4 decoded words
    "train.num_steps": 2, "train.log_every_steps": 1, "eval.every_steps": 2,
    "checkpoint.every_steps": 2, "eval.num_batches": 1, "eval.num_decode_examples": 4,
    "data.batch_size": 8, "data.max_source_len": 12, "data.max_target_len": 12,
    "model.d_model": 16, "model.num_heads": 2, "model.mlp_dim": 32,
    "model.num_encoder_layers": 1, "model.num_decoder_layers": 1}


@pytest.mark.slow  # ~110 s: real train.py points; the runner is also run for real by test_interrupt
def test_real_tiny_sweep_runs_reruns_nothing_and_reports(tmp_path):
  """`sweep.py` on configs/g2p.py:tiny (tiny overrides, a few hundred CMUdict words from
  tests/g2p_mini.py) trains and evaluates two points in parallel with the real train.py and
  eval.py; rerunning with an interpreter that does not exist succeeds with both points skipped
  and their records untouched (so no process was started); the report has both points with
  parameters, 2 steps, dev and test metrics."""
  import g2p_mini  # pylint: disable=g-import-not-at-top
  files = g2p_mini.write_files(str(tmp_path / "data"), num_train=200, num_test=16)
  data = {f"data.{k}": v for k, v in files.items()} | {"data.data_dir": str(tmp_path / "tfds")}
  flags = [f"--config.{k}={v}" for k, v in (TINY_OVERRIDES | data).items()]
  path = write_sweep(tmp_path, 'def get_sweep():\n  return sweep("model.positional", '
                     '["sinusoidal", "rope"])\n')
  w = tmp_path / "w"
  args = [f"--config={TINY}", f"--sweep={path}", f"--workdir={w}", *flags]
  env = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache"),
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  out = sweep_cli(*args, "--parallel=2", env=env, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  names = ["positional=sinusoidal", "positional=rope"]
  records = [open(w / n / runner.RECORD).read() for n in names]
  again = sweep_cli(*args, "--python=/nonexistent/python", env=env, timeout=300)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "[1/2] positional=sinusoidal: done (skipped)" in again.stdout
  assert "[2/2] positional=rope: done (skipped)" in again.stdout
  assert [open(w / n / runner.RECORD).read() for n in names] == records
  with open(w / "results.csv") as f:
    rows = list(csv.DictReader(f))
  assert [r["point"] for r in rows] == names
  for r in rows:
    assert r["status"] == "done" and r["steps"] == "2" and int(r["params"]) > 0
    for key in ("dev/loss", "dev/wer", "test/loss", "test/wer", "tokens_per_sec", "wall_seconds"):
      assert float(r[key]) >= 0, key
  assert all(f"| {n} |" in open(w / "results.md").read() for n in names)
