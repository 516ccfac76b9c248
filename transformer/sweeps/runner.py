"""Running a sweep's points: their state on disk, one process per stage, records, dry runs.

A point is trained when DONE says so and finished when `metrics.<split>.json` is there for that
step; `run()` starts only what is missing, and refuses a workdir that ran other overrides.
"""

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from absl import flags
import ml_collections

from transformer import cli, files
from transformer.config import from_configdict
from transformer.run import guard
from transformer.sweeps import watch
from transformer.sweeps.spec import apply_overrides, Commands, differing_key, Point, SweepError

RECORD = "sweep_point.json"  # per point: overrides, commands, attempts, wall time
LOG = "sweep.log"  # per point: the output of its processes
DONE = "train_done.json"  # = transformer.train.loop.DONE_FILE (importing it pulls in jax)
STOPPED = "early_stop.json"  # per point: where the sweep's early stopping (ASHA) stopped it


def read_json(path: str) -> Any:
  """A JSON file's content, or None if it is missing or unreadable (e.g. being written)."""
  try:
    return json.loads(files.read_text(path))
  except (OSError, ValueError):
    return None


def trained_step(point: Point) -> int | None:
  """The final step if train_done.json says training ended normally, else None."""
  done = read_json(os.path.join(point.workdir, DONE))
  if not isinstance(done, dict) or not isinstance(done.get("step"), int):
    return None
  finished = done["step"] >= point.num_steps or done.get("reason") == "early_stop"
  return done["step"] if finished else None


def stopped_early(point: Point) -> dict[str, Any] | None:
  """STOPPED's {'by': 'asha', 'step': rung step, 'metric', 'value'} if early stopping stopped the
  point (None otherwise, or once it has been trained to its end since)."""
  note = read_json(os.path.join(point.workdir, STOPPED))
  if not isinstance(note, dict) or trained_step(point) is not None:
    return None
  return note


def evaluated(point: Point, split: str, step: int | None) -> bool:
  """True if `metrics.<split>.json` exists for the final checkpoint `step`."""
  metrics = read_json(os.path.join(point.workdir, f"metrics.{split}.json"))
  return step is not None and isinstance(metrics, dict) and metrics.get("step") == step


def status(point: Point, commands: Commands) -> str:
  """'done', 'eval' (trained, evaluation missing), 'resume' (started) or 'new'."""
  step = trained_step(point)
  if step is not None:
    needs_eval = commands.has_eval() and not evaluated(point, commands.eval_split, step)
    return "eval" if needs_eval else "done"
  started = any(files.exists(os.path.join(point.workdir, f))
                for f in ("checkpoints", "metrics.jsonl"))
  return "resume" if started else "new"


def point_run(point: Point, commands: Commands) -> dict[str, Any]:
  """What a point's results are of: the config argument and its complete overrides, as JSON."""
  run = {"config": commands.config_arg, "overrides": commands.overrides(point)}
  return json.loads(json.dumps(run, default=str))


def check_same_runs(points: Sequence[Point], commands: Commands) -> None:
  """SweepError naming the first point whose workdir ran another config or other overrides."""
  for p in points:
    record = read_record(p)
    old, new = record.get("run"), point_run(p, commands)
    ran = read_json(os.path.join(p.workdir, "config.json")) if old is None else None
    if isinstance(ran, dict) and (key_value := differing_key(ran, new["overrides"])):
      key, value = key_value  # a run this sweep did not start (no RECORD), of other overrides
      raise SweepError(f"{p.workdir} holds a run that no sweep started, of {key}={value!r} "
                       f"(point {p.name}: {new['overrides'][key]!r}): give another --workdir, "
                       "or remove that point's directory")
    if "overrides" in record and not isinstance(old, dict):
      raise SweepError(f"{p.workdir}/{RECORD} records no run (an older sweep runner's format); "
                       "give another --workdir, or remove that point's directory")
    if old is None or old == new:
      continue
    if old.get("config") != new["config"]:
      what = f"--config={old.get('config')} (now {new['config']})"
    else:
      was, now = old["overrides"], new["overrides"]
      key = next(k for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k))
      ran = f"--config.{key}={was[key]}" if key in was else f"no --config.{key}"
      what = f"{ran} (now {f'--config.{key}={now[key]}' if key in now else 'none'})"
    raise SweepError(f"{p.workdir} holds point {p.name} run with {what}; its results are not "
                     "this sweep's: give another --workdir, or remove that point's directory")


def read_record(point: Point) -> dict[str, Any]:
  """The point's RECORD (overrides, attempts, train/eval wall seconds), or {}."""
  record = read_json(os.path.join(point.workdir, RECORD))
  return record if isinstance(record, dict) else {}


def write_record(point: Point, record: Mapping[str, Any]) -> None:
  files.write_text_atomic(os.path.join(point.workdir, RECORD),
                          json.dumps(record, indent=1, sort_keys=True, default=str))


def write_manifest(points: Sequence[Point], commands: Commands, sweep_path: str,
                   workdir: str) -> None:
  """`<workdir>/sweep.json`: the config, sweep file, sweep-wide overrides and every point."""
  files.makedirs(workdir)
  manifest = {"config": commands.config_arg, "sweep": sweep_path,
              "base_overrides": dict(commands.base_overrides),
              "points": [{"name": p.name, "overrides": p.overrides, "workdir": p.workdir}
                         for p in points]}
  guard.write_bytes(workdir, "sweep.json", json.dumps(manifest, indent=1, default=str).encode())


_running: set[subprocess.Popen] = set()  # children of launch_subprocess, for stop_running
_running_lock = threading.RLock()  # re-entered by a signal handler that interrupts its holder
_stop_signal: int | None = None  # set by stop_running: no new process starts after it


def launch_subprocess(argv: Sequence[str], log_path: str, cwd: str | None) -> int:
  """Runs one process in its own session (a terminal's Ctrl-C reaches only the sweep), its output
  appended to `log_path`; returns its exit code (after stop_running(): minus the signal)."""
  with open(log_path, "a") as log:
    log.write(f"$ {shlex.join(argv)}\n")
    log.flush()
    with _running_lock:
      if _stop_signal is not None:
        log.write("not started: the sweep is stopping\n")
        return -_stop_signal
      try:
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                start_new_session=True)
      except OSError as e:  # e.g. a missing interpreter: this point fails, the sweep goes on
        log.write(f"cannot start {argv[0]}: {e}\n")
        return 127
      _running.add(proc)
    try:
      return proc.wait()
    finally:
      with _running_lock:
        _running.discard(proc)


def stop_running(sig: int = signal.SIGTERM) -> None:
  """Starts no new process and sends `sig` to every running child."""
  global _stop_signal
  with _running_lock:
    if _stop_signal is None:
      _stop_signal = sig
    for proc in _running:
      if proc.poll() is None:
        proc.send_signal(sig)


def stop_signal() -> int | None:
  """The signal that stopped the last run() (None if nothing stopped it)."""
  return _stop_signal


def reset_stop() -> None:
  """Lets processes start again (run() does this first; packing.run before its packs)."""
  global _stop_signal
  _stop_signal = None


FORWARDED = {signal.SIGINT: signal.SIGINT, signal.SIGTERM: signal.SIGTERM,
             signal.SIGHUP: signal.SIGTERM}  # a closed terminal: children save, as on SIGTERM


@contextlib.contextmanager
def forwarding_signals():
  """Forwards FORWARDED to the children; the first also raises KeyboardInterrupt here."""
  def forward(signum, _frame):
    first = _stop_signal is None
    stop_running(FORWARDED[signum])
    if first:
      raise KeyboardInterrupt

  previous = {}
  if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
  try:
    yield
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def latest_checkpoint(point: Point) -> int | None:
  """The newest checkpoint step in the point's workdir, or None (no orbax: it pulls in JAX)."""
  directory = os.path.join(point.workdir, "checkpoints")
  steps = [int(n) for n in os.listdir(directory) if n.isdigit()] if os.path.isdir(directory) else []
  return max(steps, default=None)


Launch = Callable[[Sequence[str], str, "str | None"], int]


def pending_commands(point: Point, commands: Commands) -> list[tuple[str, list[str]]]:
  """[('train'|'eval', argv), ...] still to run for `point` (empty when it is done)."""
  state = status(point, commands)
  todo = [] if state in ("done", "eval") else [("train", commands.train(point))]
  if state != "done" and commands.has_eval():
    todo.append(("eval", commands.eval(point)))
  return todo


def run_point(point: Point, commands: Commands, launch: Launch = launch_subprocess,
              on_stage: Callable[[str], None] = lambda stage: None) -> bool:
  """Runs what `point` still needs (calling `on_stage` with 'train' or 'eval' as each starts);
  records wall time per stage; True if it succeeded."""
  os.makedirs(point.workdir, exist_ok=True)
  record = read_record(point) | {"name": point.name, "overrides": point.overrides,
                                 "run": point_run(point, commands)}
  write_record(point, record)  # before any process: the workdir says what it is a run of
  log_path = os.path.join(point.workdir, LOG)
  for stage, argv in pending_commands(point, commands):
    if _stop_signal is not None:  # the sweep is stopping: start no further stage
      return False
    if stage == "eval" and evaluated(point, commands.eval_split, trained_step(point)):
      continue  # training had already finished (it only wrote its marker): evaluated before
    on_stage(stage)
    start = time.time()
    code = launch(argv, log_path, commands.cwd)
    seconds = time.time() - start
    record[f"{stage}_seconds"] = record.get(f"{stage}_seconds", 0.0) + seconds
    record.setdefault("attempts", []).append(
        {"stage": stage, "argv": list(argv), "returncode": code, "seconds": round(seconds, 3),
         "finished": time.strftime("%Y-%m-%dT%H:%M:%S")})
    # Exit 0 without the final checkpoint: stopped by SIGTERM (preemption); resume next time.
    # (A Ctrl-C'd train.py saves too, then ends killed by SIGINT: code -2, also resumable.)
    if code == 0 and stage == "train" and trained_step(point) is None:
      code = "stopped before train.num_steps"
      record["attempts"][-1]["returncode"] = code
    write_record(point, record)
    if code != 0:
      return False
  return True


def run(points: Sequence[Point], commands: Commands, parallel: int = 1,
        launch: Launch = launch_subprocess, echo: Callable[[str], None] = print,
        console: watch.Console | None = None) -> list[Point]:
  """Runs every unfinished point, `parallel` at a time; returns the points that failed. Lines go
  to `echo`, or through `console` (which also shows the running points' status lines): a line
  when a point fails (its exit code and log) or finishes (its result). A signal (FORWARDED)
  reaches the running points; this waits for them and raises KeyboardInterrupt."""
  reset_stop()
  check_same_runs(points, commands)
  console = console or watch.Console(echo)
  todo = []
  for p in points:
    state = status(p, commands)
    skipped = " (skipped)" if state == "done" else ""
    console.say(f"[{p.index + 1}/{len(points)}] {p.name}: {state}{skipped}")
    if not skipped:
      todo.append(p)
  lock, failed = threading.Lock(), []

  def one(p: Point) -> None:
    try:
      ok = run_point(p, commands, launch, on_stage=lambda stage: console.running(p, stage))
    finally:
      console.ended(p)
    with lock:
      if _stop_signal is not None and not ok:
        step = latest_checkpoint(p)
        console.say(f"{p.name}: stopped; " + ("no checkpoint yet" if step is None else
                                              f"its latest checkpoint is step {step}"))
      elif ok:
        record = read_record(p)  # its training's seconds too when a pack trained it
        seconds = record.get("train_seconds", 0.0) + record.get("eval_seconds", 0.0)
        console.say(watch.finished_line(p, commands.eval_split, seconds))
      else:
        attempts = read_record(p).get("attempts") or [{}]
        console.say(watch.failed_line(p, attempts[-1], os.path.join(p.workdir, LOG)))
      if not ok:
        failed.append(p)

  run_each(todo, one, parallel, console)
  return sorted(failed, key=lambda p: p.index)


def run_points(points: Sequence[Point], commands: Commands, launch: Launch) -> bool:
  """run_point for each point, one after another; True if every one succeeded."""
  return all([run_point(p, commands, launch) for p in points])


def run_each(items: Sequence[Any], one: Callable[[Any], None], parallel: int,
             console: watch.Console) -> None:
  """`one(item)` for each item, `parallel` at a time, with signals forwarded to the running
  processes; a signal or an error cancels the rest, stops the running processes and is raised."""
  pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel))
  with forwarding_signals(), console, pool:
    futures = [pool.submit(one, item) for item in items]
    try:
      for future in futures:
        future.result()
    except BaseException:  # a signal (forwarded already) or an error: stop, wait for children
      for future in futures:
        future.cancel()
      if _stop_signal is None:
        stop_running()
      raise


def prepare_data(config: ml_collections.ConfigDict, points: Sequence[Point],
                 echo: Callable[[str], None] = print) -> None:
  """Prepares each distinct data section once, here: concurrent first preparations would race."""
  from transformer.data import load_task  # pylint: disable=g-import-not-at-top  (TFDS: sweeps without data need none)
  seen = set()
  for p in points:
    cfg = from_configdict(apply_overrides(config, p.overrides))
    key = json.dumps(dataclasses.asdict(cfg.data), sort_keys=True)
    if key not in seen:
      seen.add(key)
      echo(f"preparing data {cfg.data.dataset} ({cfg.data.data_dir or 'default data_dir'})")
      load_task(cfg, None, process_index=0, process_count=1)


def dry_run_lines(points: Sequence[Point], commands: Commands,
                  packs: Sequence[tuple[int, int]] = ()) -> list[str]:
  """The commands `run` would start, a comment line per point, and a comment that counts them,
  with `packs` (points, steps) of packed training runs listed before (packing.dry_run_lines)."""
  packed = sum(n for n, _ in packs)
  stages = ["train"] * len(packs) + ["eval"] * (packed if commands.has_eval() else 0)
  lines, steps, states = [], sum(s for _, s in packs), []
  for p in points:
    todo = pending_commands(p, commands)
    states.append(status(p, commands))
    lines.append(f"# {p.name}: {states[-1]}" + ("" if todo else " (skipped)"))
    lines += [shlex.join(argv) for _, argv in todo]
    stages += [stage for stage, _ in todo]
    steps += p.num_steps if ("train", commands.train(p)) in todo else 0
  lines.append(f"# {len(points) + packed} points: {stages.count('train')} training runs to start "
               f"({'at most ' if 'resume' in states else ''}{steps} training steps in all), "
               f"{stages.count('eval')} evaluations, {states.count('done')} points done")
  return lines


def main(argv: Sequence[str] | None = None) -> int:
  """`python -m transformer.sweeps.runner is_done WORKDIR --num_steps=N [--split=S]`: exit 0 if
  the run in WORKDIR is done, else 1 (errors too); tpu_vm_command's commands start with it."""
  def define(f: flags.FlagValues) -> None:
    flags.DEFINE_integer("num_steps", None, "the run's training steps", flag_values=f)
    flags.mark_flag_as_required("num_steps", flag_values=f)
    flags.DEFINE_string("split", "", "the split it must be evaluated on ('' = none)", flag_values=f)

  args, rest = cli.parse_own_flags("python -m transformer.sweeps.runner is_done WORKDIR", define,
                                   sys.argv[1:] if argv is None else list(argv))
  if len(rest) != 2 or rest[0] != "is_done":
    print(f"error: expected the arguments is_done WORKDIR, got {' '.join(rest) or 'none'} "
          f"(see --help)", file=sys.stderr)
    return 2
  workdir = rest[1]
  point = Point(0, {}, os.path.basename(os.path.normpath(workdir)), workdir, args.num_steps)
  state = status(point, Commands("", eval_split=args.split))
  print(f"{workdir}: {state}" + (" (skipped)" if state == "done" else ""))
  return 0 if state == "done" else 1


if __name__ == "__main__":
  sys.exit(main())
