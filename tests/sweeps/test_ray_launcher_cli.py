"""docs/sweeps.md's one-machine Ray cluster, started with the `ray` CLI as the docs write it
(only the port is a free one, and RAY_TMPDIR keeps its files apart from any other Ray here): a
sweep point runs on it through ray_launcher.connect (token authentication on, as Ray 2.60's
`ray start` sets it), and a local Ray (`--early_stop=asha` without --ray_address) starts beside
it instead of failing on it. The cluster's processes are stopped by their pids, not by the docs'
`ray stop`, which would stop every Ray of this user on the machine (another test's too)."""

import os
import re
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


def stop_processes_of(directory: str) -> None:
  """SIGTERM, then SIGKILL, the processes whose command line names `directory` (Ray's own)."""
  for sig in (signal.SIGTERM, signal.SIGKILL):
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    pids = [int(line.split()[0]) for line in out.splitlines() if directory in line]
    for pid in pids:
      try:
        os.kill(pid, sig)
      except ProcessLookupError:
        pass
    time.sleep(2 if pids else 0)


def test_the_documented_one_machine_cluster_runs_a_point(tmp_path):
  """`ray start` as docs/sweeps.md writes it starts a head on 127.0.0.1 with token
  authentication; ray_launcher.connect('127.0.0.1:PORT') runs a task there (its CPUs the docs'
  --num-cpus), and connect('') starts a Ray of its own beside it (1 CPU), not 'When connecting
  to an existing cluster, num_cpus and num_gpus must not be provided'."""
  start, sweep, stop = documented_commands()
  assert sweep.startswith("python sweep.py ") and "--ray_address=127.0.0.1:6399" in sweep
  assert stop == "ray stop"
  port = free_port()
  words = shlex.split(start.replace("--port=6399", f"--port={port}"))
  env_words = [w for w in words if re.match(r"^[A-Z_]+=", w)]
  argv = words[len(env_words):]
  assert argv[:3] == ["ray", "start", "--head"] and "--node-ip-address=127.0.0.1" in argv
  temp = tempfile.mkdtemp(prefix="rayc", dir="/tmp")  # short: Ray's socket paths have a limit
  env = dict(os.environ, RAY_TMPDIR=temp, RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=ROOT,
             **dict(w.split("=", 1) for w in env_words))
  env.pop("RAY_AUTH_MODE", None)  # as a user's shell has it: `ray start`'s default
  try:
    started = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ray"), *argv[1:]],
                             env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr[-3000:]
    assert "Token authentication is enabled" in started.stdout + started.stderr
    assert "Local node IP: 127.0.0.1" in started.stdout + started.stderr
    client = dict(env)
    client.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")  # sweep.py's own environment
    for address, cpus in ((f"127.0.0.1:{port}", "2.0"), ("", "1.0")):
      done = subprocess.run([sys.executable, "-c", ONE_POINT, address], env=client, cwd=ROOT,
                            capture_output=True, text=True, timeout=180)
      assert done.returncode == 0, (address, done.stderr[-3000:])
      assert done.stdout.strip().endswith(f"CPUs {cpus}"), done.stdout
      assert "Unauthenticated" not in done.stderr and "InvalidAuthToken" not in done.stderr
  finally:
    stop_processes_of(temp)
    shutil.rmtree(temp, ignore_errors=True)
