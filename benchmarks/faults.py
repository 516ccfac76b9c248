r"""Fault campaign: SIGKILL a training run at random moments, resume it each time, compare bitwise.

  python benchmarks/faults.py --kills=20 --seed=0 --config=configs/g2p.py:tiny \
      --workdir=/tmp/faults_runs/campaign --data_dir=/tmp/faults_tfds

Trains the config (cut by CAMPAIGN_OVERRIDES to 100 steps, a checkpoint every 10 steps and an
evaluation every 25; `--override KEY=VALUE` adds more) once uninterrupted (`<workdir>/reference`),
then again in `<workdir>/victim`, killed with SIGKILL `--kills` times and restarted after each kill
with the same command, as a user would. The kill moments are drawn from `--seed`, spread over the
run and over three phases:
  step  during training steps, a random fraction of a step after one was reported
  save  while an asynchronous checkpoint is being written: as soon as its
        `<step>.orbax-checkpoint-tmp-*` directory appears, or right after `save()` returned and the
        write went on in the background (alternately)
  eval  a random fraction into an evaluation (of the reference run's shortest one)
At the end every leaf of the final train state (parameters, optimizer state, step, key) of the
victim must equal the reference's bit for bit. One line per kill (phase, step, latest checkpoint
left on disk), then `survived K/N kills, parameters bitwise equal: True|False`; exit status 1 if
not all survived or the states differ.

The runs are child processes of this script (`--child`) that call loop.train_and_evaluate
with the loop's phases reported on stdout ("@step 12", "@save_begin 20", ...) by wrappers
installed in the child only: the library has no event hooks, and the campaign must not change the
loop it tests. A persistent compilation cache (`<workdir>/jax_cache`) keeps restarts short.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import glob
import importlib.util
import os
import queue
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

PHASES = ("step", "save", "eval")
CAMPAIGN_OVERRIDES = {  # :tiny cut to ~2 min on 2 CPU cores; many checkpoints and evals to hit
    "train.num_steps": 100, "train.log_every_steps": 10, "checkpoint.every_steps": 10,
    "checkpoint.keep": 2, "eval.every_steps": 25, "eval.num_batches": 2,
    "eval.num_decode_examples": 32}
CHILD_TIMEOUT_S = 900  # one child run (a resume) must report progress within this


# ---------------------------------------------------------------- the child: one training run

def load_config(spec: str, overrides: dict[str, Any], data_dir: str):
  """The ConfigDict of `path.py[:arg]` with `overrides` (dotted keys) and data.data_dir."""
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("faults_config", os.path.join(REPO, path))
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  cd = module.get_config(arg) if arg else module.get_config()
  cd.update_from_flattened_dict(dict(overrides))
  if data_dir:
    cd.data.data_dir = data_dir
  return cd


def _say(*words: Any) -> None:
  print("@" + " ".join(map(str, words)), flush=True)


def _instrument() -> None:
  """Makes the loop report its phases on stdout (in this child process only)."""
  from transformer.infer import evaluation  # pylint: disable=g-import-not-at-top
  from transformer.run import checkpoints, reporting
  from transformer.train import loop
  progress, evaluate = reporting.Reporter.progress, loop.eval_sums
  decode, save = evaluation.decode_metrics, checkpoints.Checkpointer.save

  def progress_(self, step, *args, **kwargs):
    progress(self, step, *args, **kwargs)
    _say("step", step)

  def evaluate_(*args, **kwargs):
    _say("eval_begin")
    return evaluate(*args, **kwargs)

  def decode_(*args, **kwargs):
    out = decode(*args, **kwargs)
    _say("eval_end")
    return out

  def save_(self, step, *args, **kwargs):
    _say("save_begin", step)
    saved = save(self, step, *args, **kwargs)
    _say("save_end", step, int(saved))
    return saved

  reporting.Reporter.progress, loop.eval_sums = progress_, evaluate_
  evaluation.decode_metrics, checkpoints.Checkpointer.save = decode_, save_


def child_main(args: argparse.Namespace) -> None:
  """One training run (fresh or resumed) in args.workdir."""
  _instrument()
  from transformer.train import loop  # pylint: disable=g-import-not-at-top
  cd = load_config(args.config, parse_overrides(args.override), args.data_dir)
  final = loop.train_and_evaluate(cd, args.workdir)
  _say("done", final.get("step"))


# ---------------------------------------------------------------- the campaign

@dataclasses.dataclass
class Kill:
  """One planned kill: the first `phase` event at or after `step`, `fraction` of the way in."""
  phase: str
  step: int
  fraction: float
  variant: int  # save kills: 0 = when the tmp dir appears, 1 = after save() returned


def plan_kills(kills: int, seed: int, num_steps: int, ckpt_every: int, eval_every: int
               ) -> list[Kill]:
  """`kills` kills, phases balanced and shuffled, target steps spread over the run, in order.

  Save kills aim at checkpoints before the last one: a kill just after the final checkpoint was
  committed would leave a finished run, with no moment left for the kills after it.
  """
  rng = random.Random(seed)
  phases = [PHASES[i % len(PHASES)] for i in range(kills)]
  rng.shuffle(phases)
  plan, saves = [], 0
  for phase, step in zip(phases, sorted(rng.randint(1, num_steps - 1) for _ in range(kills))):
    if phase == "save":  # the next checkpoint step
      step = min(-(-step // ckpt_every) * ckpt_every, (num_steps - 1) // ckpt_every * ckpt_every)
    elif phase == "eval":  # the next evaluation (the last one comes before the last checkpoint)
      step = min(-(-step // eval_every) * eval_every, num_steps)
    plan.append(Kill(phase, step, rng.random(), saves % 2 if phase == "save" else 0))
    saves += phase == "save"
  return sorted(plan, key=lambda k: k.step)


class Child:
  """A child training process whose '@' event lines arrive on a queue as (time, words)."""

  def __init__(self, args: argparse.Namespace, workdir: str, log_path: str):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", f"--config={args.config}",
           f"--workdir={workdir}", f"--data_dir={args.data_dir}"]
    cmd += [f"--override={o}" for o in args.override]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO,
               JAX_COMPILATION_CACHE_DIR=os.path.join(args.workdir, "jax_cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    self._log = open(log_path, "a")  # pylint: disable=consider-using-with
    self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                 stderr=self._log, text=True)
    self.events: queue.Queue = queue.Queue()
    self.progressed = False  # reported a training step: it started (or resumed) and trained
    self.exited = False  # its stdout ended
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self) -> None:
    for line in self.proc.stdout:
      if line.startswith("@"):
        self.events.put((time.monotonic(), line[1:].split()))
    self.events.put((time.monotonic(), ["exit"]))

  def next_event(self, timeout: float | None = None) -> tuple[float, list[str]] | None:
    """The next event; with a timeout, None if none came by then. Without one, raises
    RuntimeError if none comes within CHILD_TIMEOUT_S."""
    try:
      t, words = self.events.get(timeout=max(0.0, timeout) if timeout is not None
                                 else CHILD_TIMEOUT_S)
    except queue.Empty as e:
      if timeout is not None:
        return None
      self.kill()
      raise RuntimeError(f"no progress from the training process for {CHILD_TIMEOUT_S} s") from e
    self.progressed |= words[0] == "step"
    self.exited |= words[0] == "exit"
    return t, words

  def wait(self) -> int:
    """Follows the events to the end of the run; returns the exit status."""
    while not self.exited:
      self.next_event()
    self.kill()
    return self.proc.returncode

  def kill(self) -> None:
    if self.proc.poll() is None:
      self.proc.send_signal(signal.SIGKILL)
    self.proc.wait()
    self._log.close()


def _ckpt_dir(workdir: str) -> str:
  return os.path.join(workdir, "checkpoints")


def latest_checkpoint(workdir: str) -> int | None:
  """The newest committed checkpoint step in workdir (tmp dirs excluded)."""
  d = _ckpt_dir(workdir)
  steps = [int(s) for s in os.listdir(d) if s.isdigit()] if os.path.isdir(d) else []
  return max(steps, default=None)


def _tmp_dirs(workdir: str, step: int) -> list[str]:
  return glob.glob(os.path.join(_ckpt_dir(workdir), f"{step}.orbax-checkpoint-tmp*"))


def run_reference(args: argparse.Namespace, workdir: str) -> dict[str, float]:
  """Trains the uninterrupted run; returns the median seconds of a step and of an evaluation."""
  child = Child(args, workdir, workdir + ".log")
  step_times, eval_times, last, eval_start = [], [], None, None
  while not child.exited:
    t, words = child.next_event()
    if words[0] == "step":
      if last is not None and eval_start is None:
        step_times.append(t - last)
      last = t
    elif words[0] == "eval_begin":
      eval_start = t
    elif words[0] == "eval_end":
      eval_times.append(t - eval_start)
      eval_start, last = None, None
  if child.wait() != 0:
    raise RuntimeError(f"the reference run failed (exit {child.proc.returncode}); see "
                       f"{workdir}.log")
  # The shortest evaluation: the first one of a run also compiles, so kills aim within the others.
  return {"step_s": statistics.median(step_times), "eval_s": min(eval_times)}


_PHASE_OF_EVENT = {"step": "step", "eval_begin": "eval", "eval_end": "step", "save_begin": "save",
                   "save_end": "save"}


def run_until_kill(child: Child, kill: Kill, workdir: str, timing: dict[str, float]
                   ) -> tuple[str, int] | None:
  """Follows the child's events and SIGKILLs it at `kill`'s moment; returns (the phase it was in
  when killed, its last step), or None if the child exited first."""
  trigger = {"step": "step", "eval": "eval_begin", "save": "save_begin"}[kill.phase]
  phase, step = "startup", None

  def follow(words):
    nonlocal phase, step
    phase = _PHASE_OF_EVENT.get(words[0], phase)
    step = int(words[1]) if words[0] == "step" else step

  while True:
    _, words = child.next_event()
    if words[0] == "exit":
      return None
    follow(words)
    if words[0] == trigger and step >= kill.step:
      break
  if kill.phase == "save" and kill.variant == 0:  # as soon as the tmp dir appears (or commit)
    committed = os.path.join(_ckpt_dir(workdir), str(step))
    deadline = time.monotonic() + 60
    while (not _tmp_dirs(workdir, step) and not os.path.isdir(committed)
           and child.proc.poll() is None and time.monotonic() < deadline):
      time.sleep(0.001)
  elif kill.phase == "save":  # right after save() returned, while the write goes on
    words = []
    while not child.exited and words[:1] != ["save_end"]:
      words = child.next_event()[1]
      follow(words)
  else:  # a random fraction of a step or of an evaluation, following the events meanwhile
    wait = kill.fraction * timing["step_s" if kill.phase == "step" else "eval_s"]
    deadline = time.monotonic() + wait
    while not child.exited and (event := child.next_event(deadline - time.monotonic())):
      follow(event[1])
  while not child.exited and (event := child.next_event(0.0)):  # the phase at the kill
    follow(event[1])
  if child.exited:  # it ended by itself meanwhile
    return None
  if phase == "save":
    phase = "save, tmp dir present" if _tmp_dirs(workdir, step) else "save, committed"
  child.kill()
  return phase, step


def final_state(workdir: str, step: int) -> dict[str, Any]:
  """Every leaf of the train state saved at `step`, as numpy arrays keyed by path."""
  from absl import logging  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.ERROR)  # orbax warns that the state item has no metadata file
  path = os.path.join(_ckpt_dir(workdir), str(step), "state")
  ckptr = ocp.StandardCheckpointer()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                        ckptr.metadata(path).item_metadata.tree)
  state = ckptr.restore(path, target)
  return {jax.tree_util.keystr(k): np.asarray(v)
          for k, v in jax.tree_util.tree_leaves_with_path(state)}


def bitwise_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
  """Same leaf paths, dtypes, shapes and bytes."""
  return a.keys() == b.keys() and all(
      a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes()
      for k in a)


def campaign(args: argparse.Namespace) -> dict[str, Any]:
  """Runs the reference and the killed run; returns {'survived', 'kills', 'equal', 'log'}."""
  overrides = {**CAMPAIGN_OVERRIDES, **parse_overrides(args.override)}
  args.override = [f"{k}={v!r}" for k, v in overrides.items()]
  cd = load_config(args.config, overrides, args.data_dir)
  num_steps = cd.train.num_steps
  os.makedirs(args.workdir, exist_ok=True)
  reference, victim = (os.path.join(args.workdir, n) for n in ("reference", "victim"))
  for d in (reference, victim):
    shutil.rmtree(d, ignore_errors=True)
  started = time.monotonic()
  timing = run_reference(args, reference)
  print(f"reference: {num_steps} steps in {time.monotonic() - started:.0f} s (median step "
        f"{timing['step_s']:.3f} s, evaluation {timing['eval_s']:.2f} s)", flush=True)
  plan = plan_kills(args.kills, args.seed, num_steps, cd.checkpoint.every_steps,
                    cd.eval.every_steps)
  survived, log, unresumed = 0, [], False  # unresumed: a kill no run has resumed from yet
  for i, kill in enumerate(plan, start=1):
    before = latest_checkpoint(victim)
    child = Child(args, victim, victim + ".log")
    hit = run_until_kill(child, kill, victim, timing)
    status = None if hit else child.wait()
    if unresumed and (child.progressed or status == 0):  # resumed and trained (or was done)
      survived, unresumed = survived + 1, False
    if hit is None:
      print(f"kill {i}/{len(plan)}: not done, the run {'finished' if status == 0 else 'failed'}"
            f" before {kill.phase} at step {kill.step}; see {victim}.log", flush=True)
      if status:
        break
      continue
    phase, step = hit
    unresumed = True
    log.append(f"kill {i}/{len(plan)}: phase={phase} step={step} (this run resumed from "
               f"{before if before is not None else 'scratch'}; latest checkpoint now "
               f"{latest_checkpoint(victim)})")
    print(log[-1], flush=True)
  child = Child(args, victim, victim + ".log")  # the last resume runs to the end
  status = child.wait()
  survived += unresumed and status == 0
  finished = status == 0 and latest_checkpoint(victim) == num_steps
  equal = finished and bitwise_equal(final_state(reference, num_steps),
                                     final_state(victim, num_steps))
  print(f"survived {survived}/{args.kills} kills, parameters bitwise equal: {equal} "
        f"(wall time {time.monotonic() - started:.0f} s)", flush=True)
  return {"survived": survived, "kills": len(log), "equal": equal, "log": log}


def parse_overrides(items: list[str]) -> dict[str, Any]:
  """['train.num_steps=40', ...] -> {'train.num_steps': 40, ...} (Python literals, else str)."""
  out = {}
  for item in items:
    key, sep, value = item.partition("=")
    if not sep:
      raise SystemExit(f"error: --override {item!r} is not KEY=VALUE")
    try:
      out[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      out[key] = value
  return out


def parse_args(argv: list[str]) -> argparse.Namespace:
  """The command line (see the module docstring)."""
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--kills", type=int, default=20)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--config", default="configs/g2p.py:tiny")
  p.add_argument("--workdir", default="/tmp/faults_runs/campaign")
  p.add_argument("--data_dir", default="", help="data.data_dir (default: the config's)")
  p.add_argument("--override", action="append", default=[], help="KEY=VALUE, repeatable")
  p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  return p.parse_args(argv)


if __name__ == "__main__":
  ARGS = parse_args(sys.argv[1:])
  if ARGS.child:
    child_main(ARGS)
  else:
    RESULT = campaign(ARGS)
    sys.exit(0 if RESULT["equal"] and RESULT["survived"] == ARGS.kills else 1)
