"""docs/sweeps.md's one-machine Ray cluster, started with the `ray` CLI as the docs write it
(its exported variables, then `ray start`; only the port is a free one, and RAY_TMPDIR keeps its
files apart from any other Ray here): a sweep point runs on it through ray_launcher.connect
(token authentication on, as Ray 2.60's `ray start` sets it), and a local Ray (`--early_stop=asha`
without --ray_address) starts beside it instead of failing on it. The cluster's processes are
stopped by their pids, not by the docs' `ray stop`, which would stop every Ray of this user on
the machine (another test's too). The cluster test is slow (`pytest -m slow
tests/sweeps/test_ray_launcher_cli.py`); the default suite checks the documented lines."""

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from sweep_fixtures import ROOT

pytest.importorskip("ray")  # the [dev] extra brings it
DOCS = os.path.join(ROOT, "docs", "sweeps.md")
ONE_POINT = r"""
import sys
from transformer.sweeps import ray_launcher
ray = ray_launcher.connect(sys.argv[1], num_cpus=1)
print("ran on", ray.get(ray.remote(lambda: __import__("socket").gethostname()).remote()),
      "CPUs", ray.cluster_resources().get("CPU"))
"""


def documented_commands() -> list[str]:
  """The bash lines of the block under docs/sweeps.md's `<!-- ray loopback -->` mark, continued
  lines joined."""
  with open(DOCS, encoding="utf-8") as f:
    text = f.read()
  block = text.split("<!-- ray loopback -->", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
  return [line.split("  #")[0].strip() for line in block.replace("\\\n", " ").splitlines()]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def stop_processes_of(directory: str) -> list[int]:
  """SIGTERM, then SIGKILL, the processes whose command line names `directory` (Ray's own, read
  from /proc: `ps` would cut long command lines); the pids it signalled."""
  signalled = []
  for sig in (signal.SIGTERM, signal.SIGKILL):
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
      try:
        with open(f"/proc/{entry}/cmdline", "rb") as f:
          if directory.encode() in f.read():
            pids.append(int(entry))
      except OSError:  # a process that ended
        continue
    for pid in pids:
      try:
        os.kill(pid, sig)
      except ProcessLookupError:
        pass
    signalled += pids
    time.sleep(2 if pids else 0)
  return signalled


def test_the_documented_commands_are_the_ones_tested():
  """The docs' block (what the slow test below runs): the token mode and loopback variables
  exported, a head on 127.0.0.1, sweep.py at its address, ray stop."""
  export, start, sweep, stop = documented_commands()
  assert shlex.split(export) == ["export", "RAY_AUTH_MODE=token",
                                 "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0"]
  assert shlex.split(start)[:3] == ["ray", "start", "--head"]
  assert {"--node-ip-address=127.0.0.1", "--port=6399"} <= set(shlex.split(start))
  assert sweep.startswith("python sweep.py ") and "--ray_address=127.0.0.1:6399" in sweep
  assert stop == "ray stop"


@pytest.mark.slow  # ~40-70 s on 2 cores: a cluster, then three drivers
def test_the_documented_one_machine_cluster_runs_a_point(tmp_path):
  """`ray start` as docs/sweeps.md writes it starts a head on 127.0.0.1 with token
  authentication; without RAY_AUTH_MODE=token connect('127.0.0.1:PORT') fails in a line that
  says to export it; with it, connect runs a task there (its CPUs the docs' --num-cpus), and
  connect('') starts a Ray of its own beside it (1 CPU), not 'When connecting to an existing
  cluster, num_cpus and num_gpus must not be provided'."""
  export, start, sweep, stop = documented_commands()
  assert sweep.startswith("python sweep.py ") and "--ray_address=127.0.0.1:6399" in sweep
  assert stop == "ray stop"
  exported = dict(w.split("=", 1) for w in shlex.split(export)[1:])
  assert exported["RAY_AUTH_MODE"] == "token"
  port = free_port()
  argv = shlex.split(start.replace("--port=6399", f"--port={port}"))
  assert argv[:3] == ["ray", "start", "--head"] and "--node-ip-address=127.0.0.1" in argv
  temp = tempfile.mkdtemp(prefix="rayc", dir="/tmp")  # short: Ray's socket paths have a limit
  env = dict(os.environ, RAY_TMPDIR=temp, RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=ROOT,
             **exported)
  try:
    started = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ray"), *argv[1:]],
                             env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr[-3000:]
    assert "Local node IP: 127.0.0.1" in started.stdout + started.stderr
    without = {k: v for k, v in env.items() if k != "RAY_AUTH_MODE"}  # a shell without the export
    refused = subprocess.run([sys.executable, "-c", ONE_POINT, f"127.0.0.1:{port}"], env=without,
                             cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines()[-1].endswith(
        "wants token authentication: export RAY_AUTH_MODE=token (docs/sweeps.md#ray)"), \
        refused.stderr[-2000:]
    for address, cpus in ((f"127.0.0.1:{port}", "2.0"), ("", "1.0")):
      done = subprocess.run([sys.executable, "-c", ONE_POINT, address], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=180)
      assert done.returncode == 0, (address, done.stderr[-3000:])
      assert done.stdout.strip().endswith(f"CPUs {cpus}"), done.stdout
  finally:
    assert stop_processes_of(temp)  # the cluster's processes were found and stopped
    shutil.rmtree(temp, ignore_errors=True)
