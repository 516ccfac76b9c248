"""Sweeps: expansion and naming, validation before anything runs, exact dry-run and TPU commands,
the runner (fake trainer: parallel, failure, rerun skips), the report, and one real `:tiny` sweep."""

import csv
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest

from configs import sweeps as helpers
from transformer import sweep_report, sweep_runner, sweeps
from transformer.config import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = "configs/g2p.py:tiny"


def sweep_cli(*args, env=None, timeout=60):
  """Runs sweep.py from the repository root; returns the CompletedProcess."""
  env = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
  return subprocess.run([sys.executable, "sweep.py", *args], cwd=ROOT, env=env, text=True,
                        capture_output=True, timeout=timeout, check=False)


def write_sweep(tmp_path, body, name="s.py"):
  path = tmp_path / name
  path.write_text("from configs.sweeps import sweep, product, zip, chain\n\n"
                  + textwrap.dedent(body))
  return str(path)


# ------------------------------------------------------------------ expansion and naming


def test_product_zip_chain_expand_like_naive_loops():
  """product = every combination with the last factor fastest (as itertools.product), zip pairs
  point i with point i, chain concatenates; a key set twice or unequal zip lengths is an error."""
  a, b = [0.1, 0.2], ["x", "y", "z"]
  got = helpers.product(helpers.sweep("k.a", a), helpers.sweep("k.b", b))
  assert got == [{"k.a": va, "k.b": vb} for va, vb in itertools.product(a, b)]
  assert [list(p) for p in got] == [["k.a", "k.b"]] * 6  # key order = factor order
  assert helpers.zip(helpers.sweep("k.a", a), helpers.sweep("k.c", [1, 2])) == [
      {"k.a": 0.1, "k.c": 1}, {"k.a": 0.2, "k.c": 2}]
  assert helpers.chain(helpers.sweep("k.a", a), [{"k.b": "x"}]) == [
      {"k.a": 0.1}, {"k.a": 0.2}, {"k.b": "x"}]
  with pytest.raises(ValueError, match="different lengths"):
    helpers.zip(helpers.sweep("k.a", a), helpers.sweep("k.b", b))
  with pytest.raises(ValueError, match="'k.a' is set by two"):
    helpers.product(helpers.sweep("k.a", a), helpers.sweep("k.a", [3]))
  with pytest.raises(TypeError, match="values must be a list"):
    helpers.sweep("k.a", "abc")


def test_point_names_are_readable_safe_unique_and_short():
  """Names join label=value in the sweep's key order (short labels, repr floats, lower-case
  bools); unsafe characters become '_'; a name over the limit is cut and ends in a hash, so
  points that differ only after the cut still get different names; shared last parts of two
  keys fall back to the full key."""
  names = sweeps.point_names(helpers.product(
      helpers.sweep("model.positional", ["rope"]), helpers.sweep("train.learning_rate", [3e-4]),
      helpers.sweep("model.tie_embeddings", [False])))
  assert names == ["positional=rope,lr=0.0003,tie_embeddings=false"]
  assert sweeps.point_names([{"data.train_file": "a/b c.tsv"}]) == ["train_file=a_b_c.tsv"]
  assert sweeps.point_names([{}]) == ["baseline"]
  assert sweeps.point_names([{"data.batch_size": 8, "eval.batch_size": 4}]) == [
      "data.batch_size=8,eval.batch_size=4"]
  long = [{"data.train_file": "x" * 100 + str(i)} for i in range(2)]
  cut = sweeps.point_names(long)
  assert len(set(cut)) == 2 and all(len(n) <= sweeps.MAX_NAME_LEN for n in cut)
  assert all(n.startswith("train_file=xxxx") for n in cut)


def test_shipped_sweep_files_expand_and_validate():
  """Every shipped sweep file plans against g2p :small with distinct names and valid configs,
  with the point counts the files promise (6 positional, 3 norm, 4 ffn, 8 regularization, 6 lr,
  2 arch), and the gated FFNs / decoder-only model get matched sizes."""
  config = sweeps.load_config_file("configs/g2p.py:small")
  counts = {"positional": 6, "norm": 3, "ffn": 4, "regularization": 8, "lr": 6, "arch": 2}
  plans = {}
  for name, n in counts.items():
    plans[name] = sweeps.plan(config, "configs/g2p.py:small",
                              os.path.join(ROOT, f"configs/sweeps/{name}.py"), "w")
    assert len(plans[name]) == n and len({p.name for p in plans[name]}) == n
  assert plans["ffn"][2].overrides == {"model.ffn": "swiglu", "model.mlp_dim": 680}  # 1024 * 2/3
  assert plans["arch"][1].overrides["model.num_decoder_layers"] == 7  # 3*12 + 3*16 = 7*12 (d^2)


# ------------------------------------------------------------------ validation before running


def test_unknown_key_is_one_line_error_before_anything_runs(tmp_path):
  """A misspelt key fails in plan() naming the key, the sweep file and a suggestion; the CLI
  prints one line, exits 1 and creates no workdir (so nothing was started)."""
  path = write_sweep(tmp_path, 'def get_sweep():\n  return sweep("model.positonal", ["rope"])\n')
  with pytest.raises(sweeps.SweepError) as e:
    sweeps.plan(sweeps.load_config_file(TINY), TINY, path, str(tmp_path / "w"))
  assert "model.positonal" in str(e.value) and path in str(e.value)
  assert "did you mean 'model.positional'" in str(e.value)
  out = sweep_cli(f"--config={TINY}", f"--sweep={path}", f"--workdir={tmp_path / 'w'}")
  assert out.returncode == 1
  assert out.stderr.strip().count("\n") == 0 and "unknown override key 'model.positonal'" in out.stderr
  assert not (tmp_path / "w").exists()


def test_bad_values_are_config_errors_naming_the_point(tmp_path):
  """A value the validator rejects (unknown choice, wrong type, a broken relation) is a
  ConfigError naming the sweep file, the point and the key; a non-scalar value is a SweepError."""
  config = sweeps.load_config_file(TINY)
  cases = {'sweep("model.positional", ["rope", "sinus"])': r"point 1 \(positional=sinus\).*model.positional",
           'sweep("model.d_model", ["big"])': "point 0.*model.d_model='big'",
           'sweep("model.num_heads", [3])': "point 0.*model.num_heads=3 must divide"}
  for body, pattern in cases.items():
    path = write_sweep(tmp_path, f"def get_sweep():\n  return {body}\n")
    with pytest.raises(ConfigError, match=pattern):
      sweeps.plan(config, TINY, path, "w")
  path = write_sweep(tmp_path, 'def get_sweep():\n  return sweep("model.d_model", [[1, 2]])\n')
  with pytest.raises(sweeps.SweepError, match="must be a str, int, float or bool"):
    sweeps.plan(config, TINY, path, "w")


# ------------------------------------------------------------------ exact commands


def test_dry_run_prints_the_exact_commands(tmp_path):
  """--dry_run prints, per point, a status comment and the exact train/eval argv (sweep-wide
  --config.* overrides first, then the point's), and runs nothing."""
  path = write_sweep(tmp_path, 'def get_sweep():\n  return sweep("model.positional", '
                     '["sinusoidal", "rope"])\n')
  w = tmp_path / "w"
  out = sweep_cli(f"--config={TINY}", f"--sweep={path}", f"--workdir={w}", "--python=python3",
                  "--config.train.num_steps=4", "--dry_run")
  assert out.returncode == 0, out.stderr
  assert out.stdout == textwrap.dedent(f"""\
      # positional=sinusoidal: new
      python3 train.py --config={TINY} --workdir={w}/positional=sinusoidal --config.train.num_steps=4 --config.model.positional=sinusoidal
      python3 eval.py --workdir={w}/positional=sinusoidal --split=test
      # positional=rope: new
      python3 train.py --config={TINY} --workdir={w}/positional=rope --config.train.num_steps=4 --config.model.positional=rope
      python3 eval.py --workdir={w}/positional=rope --split=test
      """)
  assert not w.exists()


def test_tpu_vm_commands_are_exact_and_never_executed(tmp_path):
  """--launcher=tpu_vm prints one gcloud ssh per point (all workers; workdir and data_dir on the
  bucket; train then eval, both skipped when `sweep_runner is_done` says the point is done), then
  as the last line the exact command that collects the results (without checkpoints) and reports;
  missing TPU flags are a one-line error."""
  path = write_sweep(tmp_path, 'def get_sweep():\n  return sweep("train.learning_rate", [0.5, 2.0])\n')
  out = sweep_cli("--config=configs/g2p.py:small", f"--sweep={path}", "--workdir=runs/sw",
                  "--launcher=tpu_vm", "--tpu_name=my-tpu", "--zone=us-central2-b",
                  "--bucket=gs://bkt/", "--eval_split=test")
  assert out.returncode == 0, out.stderr
  expected = []
  for lr in ("0.5", "2.0"):
    w = f"gs://bkt/runs/sw/lr={lr}"
    expected += [f"# lr={lr}", (
        "gcloud compute tpus tpu-vm ssh my-tpu --zone=us-central2-b --worker=all "
        f'--command="cd ~/transformer && if ! python3 -m transformer.sweep_runner is_done {w} '
        "--num_steps=20000 --split=test; then python3 train.py --config=configs/g2p.py:small "
        f"--workdir={w} --config.train.learning_rate={lr} "
        "--config.data.data_dir=gs://bkt/tensorflow_datasets && python3 eval.py "
        f'--workdir={w} --split=test; fi"')]
  expected += ["# then copy the results back (without checkpoints) and write the report:",
               "gcloud storage rsync -r -x '.*/checkpoints/.*' gs://bkt/runs/sw runs/sw && "
               f"python sweep.py --config=configs/g2p.py:small --sweep={path} --workdir=runs/sw "
               "--eval_split=test --report_only"]
  assert out.stdout.splitlines() == expected
  bad = sweep_cli("--config=configs/g2p.py:small", f"--sweep={path}", "--workdir=runs/sw",
                  "--launcher=tpu_vm", "--tpu_name=my-tpu")
  assert bad.returncode == 1 and bad.stderr == "error: --launcher=tpu_vm needs --zone, --bucket\n"


def _readme_block_after(marker: str) -> str:
  """The first fenced block after `marker` in README.md, `\\`-continued lines joined."""
  with open(os.path.join(ROOT, "README.md")) as f:
    text = f.read()
  block = text[text.index(marker):].split("```", 2)[1]
  return re.sub(r"\\\n\s*", "", block.split("\n", 1)[1]).strip()


def test_readme_tpu_sweep_lines_are_what_sweep_py_prints():
  """README's "Running on cloud TPUs": its command prints, for the point positional=rope, exactly
  the ssh line the README shows, and its last line is exactly the collect command shown there."""
  command = _readme_block_after("run them one after the other from your machine")
  args = shlex.split(command.replace(" [--execute]", ""))
  assert args[:2] == ["python", "sweep.py"]
  out = sweep_cli(*args[2:])
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  shown = _readme_block_after("which prints, for each point,").splitlines()
  assert lines[lines.index(shown[0]) + 1] == shown[1]
  collect = _readme_block_after("the last line `sweep.py` printed is exactly this command")
  assert lines[-1] == collect


def test_is_done_is_the_local_runners_test(fake, capsys):
  """`python -m transformer.sweep_runner is_done` (the TPU commands' guard) exits 0 exactly when
  the local runner would skip the point: trained to num_steps and, with --split, evaluated at
  that step; otherwise 1 with the point's status."""
  points, commands = fake
  p = points[0]
  args = ["is_done", p.workdir, f"--num_steps={p.num_steps}", "--split=test"]
  assert sweep_runner.main(args) == 1 and capsys.readouterr().out == f"{p.workdir}: new\n"
  assert sweep_runner.run(points[:1], commands, echo=lambda _: None) == []
  assert sweep_runner.status(p, commands) == "done"
  assert sweep_runner.main(args) == 0
  assert capsys.readouterr().out == f"{p.workdir}: done (skipped)\n"
  assert sweep_runner.main(args[:2] + [f"--num_steps={p.num_steps + 1}"]) == 1  # train further
  os.remove(os.path.join(p.workdir, "metrics.test.json"))
  assert sweep_runner.main(args) == 1 and capsys.readouterr().out.endswith(": eval\n")
  assert sweep_runner.main(args[:3]) == 0  # no eval split: trained is done


# ------------------------------------------------------------------ the runner, with a fake trainer

FAKE_TRAIN = """
import json, os, sys, time
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
w, n = args["workdir"], int(args["config.train.num_steps"])
lr = float(args.get("config.train.learning_rate", 1.0))
os.makedirs(w, exist_ok=True)
if os.path.exists(os.path.join(w, "FAIL_ONCE")):
  os.remove(os.path.join(w, "FAIL_ONCE"))
  sys.exit(3)
if os.path.exists(os.path.join(w, "PREEMPT_ONCE")):  # like SIGTERM: exit 0, no final checkpoint
  os.remove(os.path.join(w, "PREEMPT_ONCE"))
  sys.exit(0)
start = time.time()
time.sleep(0.5)
with open(os.path.join(w, "metrics.jsonl"), "w") as f:
  for s in range(1, n + 1):
    f.write(json.dumps({"step": s, "train/loss": lr / s, "perf/tokens_per_sec": 100.0 * s}) + "\\n")
  f.write(json.dumps({"step": n, "eval/loss": lr, "eval/wer": lr / 10}) + "\\n")
os.makedirs(os.path.join(w, "checkpoints", str(n)), exist_ok=True)
json.dump({"step": n, "reason": "num_steps"}, open(os.path.join(w, "train_done.json"), "w"))
json.dump([start, time.time()], open(os.path.join(w, "span.json"), "w"))
"""
FAKE_EVAL = """
import json, os, sys
args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
w = args["workdir"]
dev = [json.loads(l) for l in open(os.path.join(w, "metrics.jsonl"))][-1]
json.dump({"split": args["split"], "step": dev["step"], "loss": 2 * dev["eval/loss"],
           "wer": 2 * dev["eval/wer"], "decode": "greedy",
           "coverage": {"decoded_examples": 5, "split_examples": 5}}, open(os.path.join(w, "metrics.test.json"), "w"))
"""


@pytest.fixture
def fake(tmp_path):
  """Three lr points of a sweep planned in tmp_path, and Commands that run the fake scripts."""
  (tmp_path / "fake_train.py").write_text(FAKE_TRAIN)
  (tmp_path / "fake_eval.py").write_text(FAKE_EVAL)
  path = write_sweep(tmp_path, 'def get_sweep():\n  return sweep("train.learning_rate", '
                     '[0.5, 1.0, 2.0])\n')
  config = sweeps.apply_overrides(sweeps.load_config_file(TINY), {"train.num_steps": 3})
  points = sweeps.plan(config, TINY, path, str(tmp_path / "w"))
  commands = sweeps.Commands(TINY, {"train.num_steps": 3}, python=sys.executable,
                             train_script=str(tmp_path / "fake_train.py"),
                             eval_script=str(tmp_path / "fake_eval.py"))
  return points, commands


def recording(calls):
  def launch(argv, log_path, cwd):
    calls.append(list(argv))
    return sweep_runner.launch_subprocess(argv, log_path, cwd)
  return launch


def test_runner_parallel_failure_rerun_skips_and_resumes(fake):
  """parallel=2 overlaps two training processes; a failing point is reported (exit code and
  command in its record and log) while the others finish; the rerun starts only that point's
  train and eval; a third run starts no process at all. Trained means train_done.json at
  num_steps or after an early stop: a point without it or with a marker at a smaller step (a run
  to be trained further) is 'resume' (train again, training continues from its checkpoint), and
  when that train finds the step already evaluated, eval is not run again; a trained but not
  evaluated point only gets eval; a trainer that exits 0 short of num_steps (SIGTERM) counts as
  unfinished and its eval is not started."""
  points, commands = fake
  os.makedirs(points[2].workdir)
  open(os.path.join(points[2].workdir, "FAIL_ONCE"), "w").close()
  calls, lines = [], []
  failed = sweep_runner.run(points, commands, parallel=2, launch=recording(calls), echo=lines.append)
  assert [p.name for p in failed] == ["lr=2.0"]
  assert [sweep_runner.status(p, commands) for p in points] == ["done", "done", "new"]
  spans = [json.load(open(os.path.join(p.workdir, "span.json"))) for p in points[:2]]
  assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]  # they overlapped
  record = sweep_runner.read_record(points[2])
  assert record["attempts"][-1]["returncode"] == 3 and "train_seconds" in record
  assert "$ " + " ".join(record["attempts"][-1]["argv"]) in open(
      os.path.join(points[2].workdir, sweep_runner.LOG)).read()
  calls.clear()
  assert sweep_runner.run(points, commands, launch=recording(calls), echo=lines.append) == []
  assert calls == [commands.train(points[2]), commands.eval(points[2])]
  calls.clear()
  assert sweep_runner.run(points, commands, launch=recording(calls), echo=lines.append) == []
  assert calls == [] and lines[-3:] == [f"[{i + 1}/3] {p.name}: done (skipped)"
                                        for i, p in enumerate(points)]
  os.remove(os.path.join(points[0].workdir, "metrics.test.json"))
  assert sweep_runner.pending_commands(points[0], commands) == [("eval", commands.eval(points[0]))]
  done = os.path.join(points[1].workdir, "train_done.json")
  with open(done, "w") as f:
    json.dump({"step": 2, "reason": "num_steps"}, f)
  assert sweep_runner.status(points[1], commands) == "resume"
  with open(done, "w") as f:
    json.dump({"step": 2, "reason": "early_stop"}, f)
  assert sweep_runner.status(points[1], commands) == "eval"  # metrics.test.json is of step 3
  os.remove(done)
  assert sweep_runner.status(points[1], commands) == "resume"
  assert [s for s, _ in sweep_runner.pending_commands(points[1], commands)] == ["train", "eval"]
  calls.clear()
  assert sweep_runner.run(points[1:2], commands, launch=recording(calls), echo=lines.append) == []
  assert calls == [commands.train(points[1])]  # its marker says 3, evaluated at 3: no eval
  shutil.rmtree(os.path.join(points[2].workdir, "checkpoints"))
  os.remove(os.path.join(points[2].workdir, "train_done.json"))
  open(os.path.join(points[2].workdir, "PREEMPT_ONCE"), "w").close()
  calls.clear()
  assert sweep_runner.run(points[2:], commands, launch=recording(calls), echo=lines.append) == [
      points[2]]
  assert calls == [commands.train(points[2])]  # no eval of an unfinished run
  assert sweep_runner.read_record(points[2])["attempts"][-1]["returncode"] == (
      "stopped before train.num_steps")


def test_report_lists_every_point_with_its_metrics(fake, tmp_path):
  """results.csv has one row per point with the swept value, steps, the last dev evaluation, the
  test metrics, the median tokens/s of the logged windows after the first, the measured wall
  time and status (done also without checkpoints, by the logged steps); results.md bolds the best
  (lowest) test/wer; both PNGs are written."""
  points, commands = fake
  assert sweep_runner.run(points, commands, parallel=2, echo=lambda _: None) == []
  out = sweep_report.write_report(points, str(tmp_path / "w"), title="t")
  assert out["metric"] == "test/wer"
  with open(out["csv"]) as f:
    rows = list(csv.DictReader(f))
  assert [r["point"] for r in rows] == ["lr=0.5", "lr=1.0", "lr=2.0"]
  for r, lr in zip(rows, (0.5, 1.0, 2.0)):
    assert r["lr"] == str(lr) and r["steps"] == "3" and r["status"] == "done"
    assert float(r["dev/loss"]) == lr and float(r["dev/wer"]) == pytest.approx(lr / 10)
    assert float(r["test/loss"]) == 2 * lr and float(r["test/wer"]) == pytest.approx(lr / 5)
    assert float(r["tokens_per_sec"]) == 250.0  # median of 200, 300 (100 is the compile window)
    assert float(r["wall_seconds"]) >= 0.5
  shutil.rmtree(os.path.join(points[0].workdir, "checkpoints"))  # as collected from a bucket
  assert sweep_report.collect(points)[0]["status"] == "done"
  md = open(out["md"]).read()
  assert md.startswith("t\n\n| point | lr | params | steps | dev/loss |")
  assert "| **0.1** |" in md and md.count("**") == 2
  for key in ("plot", "curves"):
    with open(out[key], "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ a real :tiny sweep

TINY_OVERRIDES = {  # a 1+1-layer d=16 model, 2 steps, one eval batch, 4 decoded words
    "train.num_steps": 2, "train.log_every_steps": 1, "eval.every_steps": 2,
    "checkpoint.every_steps": 2, "eval.num_batches": 1, "eval.num_decode_examples": 4,
    "data.batch_size": 8, "data.max_source_len": 12, "data.max_target_len": 12,
    "model.d_model": 16, "model.num_heads": 2, "model.mlp_dim": 32,
    "model.num_encoder_layers": 1, "model.num_decoder_layers": 1}


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
  records = [open(w / n / sweep_runner.RECORD).read() for n in names]
  again = sweep_cli(*args, "--python=/nonexistent/python", env=env, timeout=300)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "[1/2] positional=sinusoidal: done (skipped)" in again.stdout
  assert "[2/2] positional=rope: done (skipped)" in again.stdout
  assert [open(w / n / sweep_runner.RECORD).read() for n in names] == records
  with open(w / "results.csv") as f:
    rows = list(csv.DictReader(f))
  assert [r["point"] for r in rows] == names
  for r in rows:
    assert r["status"] == "done" and r["steps"] == "2" and int(r["params"]) > 0
    for key in ("dev/loss", "dev/wer", "test/loss", "test/wer", "tokens_per_sec", "wall_seconds"):
      assert float(r[key]) >= 0, key
  assert all(f"| {n} |" in open(w / "results.md").read() for n in names)


def test_a_process_that_cannot_start_fails_its_point_only(fake):
  """A missing interpreter is each point's own failure (exit 127, reason in its sweep.log), not an
  exception that ends the sweep: every point is tried and returned as failed."""
  points, commands = fake
  broken = sweeps.Commands(**{**commands.__dict__, "python": "/nonexistent/python"})
  assert sweep_runner.run(points[:2], broken, echo=lambda _: None) == points[:2]
  assert sweep_runner.read_record(points[0])["attempts"][-1]["returncode"] == 127
  assert "cannot start /nonexistent/python" in open(
      os.path.join(points[0].workdir, sweep_runner.LOG)).read()


WAIT_FOR_SIGTERM = """
import os, signal, sys, time
w = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))["workdir"]
os.makedirs(w, exist_ok=True)
def stop(*_):
  os.makedirs(os.path.join(w, "checkpoints", "1"))  # the checkpoint a preempted run saves
  open(os.path.join(w, "checkpoints", "1", "commit_success.txt"), "w").close()
  sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(os.path.join(w, "started"), "w").close()
time.sleep(60)
"""


def test_stop_running_sends_sigterm_so_points_checkpoint_and_resume(fake, tmp_path):
  """stop_running() (what SIGTERM to sweep.py calls; Ctrl-C passes SIGINT the same way) sends
  SIGTERM to the running trainer, which checkpoints and exits 0; the runner records that point as
  stopped short of num_steps (no eval), and its state is then 'resume'."""
  points, commands = fake
  (tmp_path / "wait.py").write_text(WAIT_FOR_SIGTERM)
  waiting = sweeps.Commands(**{**commands.__dict__, "train_script": str(tmp_path / "wait.py")})
  result = []
  thread = threading.Thread(target=lambda: result.append(
      sweep_runner.run(points[:1], waiting, echo=lambda _: None)))
  thread.start()
  started = os.path.join(points[0].workdir, "started")
  for _ in range(200):
    if os.path.exists(started):
      break
    thread.join(0.05)
  sweep_runner.stop_running()
  thread.join(30)
  assert result == [[points[0]]]
  attempts = sweep_runner.read_record(points[0])["attempts"]
  assert [(a["stage"], a["returncode"]) for a in attempts] == [
      ("train", "stopped before train.num_steps")]
  assert sweep_runner.status(points[0], commands) == "resume"

