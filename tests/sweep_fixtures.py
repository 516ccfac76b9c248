"""Shared helpers of the sweep tests (test_sweep_*.py): the sweep.py CLI, sweep files written into
tmp_path, and the `fake` fixture: three planned points whose Commands run a fake trainer and
evaluator (fast scripts that write the files a real run leaves)."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from transformer.sweeps import runner, spec


def load_config_file(config_arg: str):
  """The ConfigDict of 'configs/g2p.py:small' (as `--config=` reads it)."""
  path, _, arg = config_arg.partition(":")
  spec = importlib.util.spec_from_file_location("_config_" + os.path.basename(path)[:-3], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()

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


# A fake train.py that also trains train.members packs (each member in its own directory).
FAKE_PACK_TRAIN = """
import json, os, sys
from transformer.train import members
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
w, n = args["workdir"], int(args["config.train.num_steps"])
os.makedirs(w, exist_ok=True)
if os.path.exists(os.path.join(w, "FAIL_ONCE")):
  os.remove(os.path.join(w, "FAIL_ONCE"))
  sys.exit(3)
spec = args.get("config.train.members", "")
runs = ([(os.path.join(w, members.member_name(o)), o) for o in members.parse(spec, 0)]
        if spec else [(w, {})])
for d, o in runs:
  lr = float(o.get("train.learning_rate", args.get("config.train.learning_rate", 1.0)))
  os.makedirs(os.path.join(d, "checkpoints", str(n)), exist_ok=True)
  with open(os.path.join(d, "metrics.jsonl"), "w") as f:
    for s in range(1, n + 1):
      f.write(json.dumps({"step": s, "train/loss": lr / s}) + "\\n")
    f.write(json.dumps({"step": n, "eval/loss": lr, "eval/wer": lr / 10}) + "\\n")
  json.dump({"step": n, "reason": "num_steps"}, open(os.path.join(d, "train_done.json"), "w"))
"""


@pytest.fixture
def fake(tmp_path):
  """Three lr points of a sweep planned in tmp_path, and Commands that run the fake scripts."""
  (tmp_path / "fake_train.py").write_text(FAKE_TRAIN)
  (tmp_path / "fake_eval.py").write_text(FAKE_EVAL)
  path = write_sweep(tmp_path, 'def get_sweep():\n  return sweep("train.learning_rate", '
                     "[0.5, 1.0, 2.0])\n")
  config = spec.apply_overrides(load_config_file(TINY), {"train.num_steps": 3})
  points = spec.plan(config, TINY, path, str(tmp_path / "w"))
  commands = spec.Commands(TINY, {"train.num_steps": 3}, python=sys.executable,
                             train_script=str(tmp_path / "fake_train.py"),
                             eval_script=str(tmp_path / "fake_eval.py"))
  return points, commands


def recording(calls):
  def launch(argv, log_path, cwd):
    calls.append(list(argv))
    return runner.launch_subprocess(argv, log_path, cwd)
  return launch
