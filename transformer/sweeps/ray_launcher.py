"""Sweeps on a Ray cluster: each unit of work (a list of points that one train.py command trains;
one point today) is a Ray task that runs the same processes as the local launcher.

The task asks for the unit's resources (CPUs, GPUs, the `TPU` resource Ray gives a TPU host),
runs `runner.run_point` on whichever node Ray picks, and is retried (`max_retries`) when its node
or worker dies or its train.py is killed: the rerun resumes from the point's checkpoint, as
train.py resumes from its workdir. Every node sees the same paths: this checkout, the Python
environment and the sweep's workdir (a shared filesystem). The driver collects nothing from the
tasks but their success: the report reads the workdirs, as for a local sweep.

`--early_stop=asha` runs the points as trials of Ray Tune's ASHAScheduler instead (run_asha): a
trial runs its point's processes and reports each in-training evaluation in its metrics.jsonl (the
rungs are evaluation steps); when ASHA stops a trial its train.py gets SIGTERM, saves a checkpoint
at its step and exits, and `early_stop.json` in its workdir says where (the report's status). A
stopped point resumes when the sweep runs again without early stopping.

Ray is imported here only, inside functions, so that a plain install runs every other sweep.
"""

import contextlib
import ctypes
import dataclasses
import json
import os
import re
import signal
import shlex
import socket
import subprocess
import threading
import time
from typing import Any, Callable, Iterator, Sequence

from transformer.sweeps import runner, watch
from transformer.sweeps.spec import Commands, Point, SweepError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A loopback address means a cluster on this machine: the driver stays on loopback too (Ray would
# otherwise replace 127.0.0.1 by this machine's network address and connect there).
_LOOPBACK = re.compile(r"^(127\.\d+\.\d+\.\d+|localhost)(:\d+)?$")
_PR_SET_PDEATHSIG = 1
CONNECT_TIMEOUT_S = 5.0


class PointInterrupted(RuntimeError):
  """A point's process was killed or stopped early (not by the sweep): Ray retries its task."""


@dataclasses.dataclass(frozen=True)
class Unit:
  """The work of one task: the points that one train.py command trains (one point, or a pack)."""
  name: str
  points: tuple[Point, ...]


def point_units(points: Sequence[Point]) -> list[Unit]:
  """One unit per point."""
  return [Unit(p.name, (p,)) for p in points]


@dataclasses.dataclass(frozen=True)
class Resources:
  """What one task holds while it runs: CPUs, GPUs and Ray's custom `TPU` resource (chips)."""
  num_cpus: float = 1.0
  num_gpus: float = 0.0
  tpu: float = 0.0

  def task_options(self) -> dict[str, Any]:
    """ray.remote(...).options keywords."""
    return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus,
            **({"resources": {"TPU": self.tpu}} if self.tpu else {})}

  def tune_resources(self) -> dict[str, float]:
    """tune.with_resources' dict."""
    return {"cpu": self.num_cpus, "gpu": self.num_gpus, **({"TPU": self.tpu} if self.tpu else {})}


def import_ray(what: str = "--launcher=ray") -> Any:
  """The ray module, or SweepError saying how to install it."""
  try:
    import ray  # pylint: disable=g-import-not-at-top  (an extra: only a Ray sweep needs it)
  except ImportError:
    raise SweepError(f"{what} needs Ray: pip install -e '.[ray]' (ray[tune]==2.60.0)") from None
  return ray


def is_loopback(address: str) -> bool:
  """True for '' (a local Ray) and for addresses on 127.0.0.0/8 or localhost."""
  return not address or bool(_LOOPBACK.match(address))


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
  """SweepError unless a TCP connection to host:port opens within `timeout` ('auto' and ray://
  addresses are left to Ray)."""
  match = re.match(r"^([^:/]+):(\d+)$", address)
  if not match:
    return
  try:
    with socket.create_connection((match[1], int(match[2])), timeout=timeout):
      pass
  except OSError as e:
    raise SweepError(f"--ray_address={address}: no Ray cluster answers there "
                     f"({e.strerror or type(e).__name__}); start one with `ray start --head` "
                     "(docs/sweeps.md#ray)") from None


def preflight(address: str, what: str = "--launcher=ray") -> None:
  """SweepError now (before data or processes) if Ray is missing or the address is unreachable."""
  if is_loopback(address):  # read when ray is imported
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
  import_ray(what)
  if address:
    check_reachable(address)


def connect(address: str, num_cpus: int | None = None, what: str = "--launcher=ray") -> Any:
  """Connects to the cluster at `address` ('' = starts a local Ray on 127.0.0.1 with `num_cpus`
  CPUs); returns the ray module. Usage statistics stay off."""
  os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
  preflight(address, what)
  ray = import_ray(what)
  if ray.is_initialized():
    return ray
  # Workers import this checkout's package, whatever the environment holds.
  path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
  runtime_env = {"env_vars": {"PYTHONPATH": path}}
  try:
    if address:
      ray.init(address=address, runtime_env=runtime_env, log_to_driver=False,
               logging_level="ERROR")
    else:
      ray.init(_node_ip_address="127.0.0.1", num_cpus=num_cpus, include_dashboard=False,
               runtime_env=runtime_env, log_to_driver=False, logging_level="ERROR")
  except (ConnectionError, RuntimeError, ValueError) as e:
    where = f"--ray_address={address}" if address else "a local Ray"
    raise SweepError(f"{where}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
  return ray


def _die_with_parent() -> None:
  """In the child: SIGKILL when the task's worker dies (so a retried task never meets an
  orphaned train.py still writing its workdir)."""
  with contextlib.suppress(OSError, AttributeError):
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class TiedProcesses:
  """runner.Launch for a task: each process in its own session, tied to this worker's life; a
  KeyboardInterrupt (ray.cancel) or stop() sends it SIGTERM, so that it saves a checkpoint."""

  def __init__(self) -> None:
    self.proc: subprocess.Popen | None = None
    self.stopping = False

  def __call__(self, argv: Sequence[str], log_path: str, cwd: str | None) -> int:
    with open(log_path, "a") as log:
      log.write(f"$ {shlex.join(argv)}  # on {socket.gethostname()}\n")
      log.flush()
      if self.stopping:
        return -signal.SIGTERM
      try:
        self.proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                     start_new_session=True, preexec_fn=_die_with_parent)
      except OSError as e:
        log.write(f"cannot start {argv[0]}: {e}\n")
        return 127
      try:
        while True:  # waits in slices: ray.cancel's KeyboardInterrupt lands between bytecodes
          with contextlib.suppress(subprocess.TimeoutExpired):
            return self.proc.wait(timeout=0.5)
      except KeyboardInterrupt:
        self.stop()
        raise

  def _signal_group(self, sig: int) -> bool:
    proc = self.proc
    if proc is None or proc.poll() is not None:
      return False
    with contextlib.suppress(ProcessLookupError):
      os.killpg(proc.pid, sig)  # its own session: the process and any children it started
    return True

  def pause(self) -> None:
    """SIGSTOP to the running process: it waits, at the step it reached, for resume() or stop()."""
    self._signal_group(signal.SIGSTOP)

  def resume(self) -> None:
    """SIGCONT to a paused process."""
    self._signal_group(signal.SIGCONT)

  def stop(self, timeout: float = 300.0) -> None:
    """SIGTERM to the running process (it saves and exits), then waits for it."""
    self.stopping = True
    proc = self.proc
    if proc is not None and proc.poll() is None:
      proc.send_signal(signal.SIGTERM)
      self.resume()  # a paused process receives the SIGTERM once it runs again
      try:
        proc.wait(timeout)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def interrupted(point: Point) -> bool:
  """True if the point's last attempt was killed by a signal or stopped before its end."""
  attempts = runner.read_record(point).get("attempts") or [{}]
  code = attempts[-1].get("returncode")
  return (isinstance(code, int) and code < 0) or code == "stopped before train.num_steps"


def run_points(unit: Unit, commands: Commands, launch: runner.Launch) -> bool:
  """Runs a unit of single points (runner.run_points); True if every point succeeded."""
  return runner.run_points(unit.points, commands, launch)


RunUnit = Callable[[Unit, Commands, runner.Launch], bool]


def run_unit_task(unit: Unit, commands: Commands, run_unit: RunUnit = run_points) -> bool:
  """The body of a unit's Ray task: True if it succeeded, False if it failed for good (exit code
  in its record); PointInterrupted (retried by Ray) if one of its processes was killed."""
  if commands.cwd:
    os.chdir(commands.cwd)
  ok = run_unit(unit, commands, TiedProcesses())
  if not ok and any(interrupted(p) for p in unit.points):
    raise PointInterrupted(f"{unit.name}: a process was killed or stopped early; retrying")
  return ok


def ray_commands(commands: Commands) -> Commands:
  """`commands` with absolute script paths and this working directory, as every node sees it."""
  return dataclasses.replace(commands, train_script=os.path.abspath(commands.train_script),
                             eval_script=os.path.abspath(commands.eval_script),
                             cwd=os.path.abspath(commands.cwd or os.getcwd()))


def run(units: Sequence[Unit], commands: Commands, resources: Resources, max_retries: int,
        console: watch.Console, run_unit: RunUnit = run_points,
        poll_seconds: float = 2.0) -> list[Point]:
  """Runs each unit as a Ray task (connect() first); returns the points of the units that failed.
  A KeyboardInterrupt cancels the tasks (their processes save and stop) and is raised again."""
  import ray  # pylint: disable=g-import-not-at-top  (connect() has imported it)
  task = ray.remote(run_unit_task).options(
      **resources.task_options(), max_retries=max_retries, retry_exceptions=[PointInterrupted],
      name="sweep_unit")
  pending = {task.remote(u, commands, run_unit): u for u in units}
  for u in units:
    console.say(f"{u.name}: submitted to Ray ({_resources_text(resources)})")
  failed: list[Point] = []
  try:
    while pending:
      done, _ = ray.wait(list(pending), num_returns=1, timeout=poll_seconds)
      for ref in done:
        unit = pending.pop(ref)
        ok, why = _outcome(ray, ref, unit.name)
        for p in unit.points:
          if ok:
            console.say(watch.finished_line(p, commands.eval_split, None))
          else:
            attempt = (runner.read_record(p).get("attempts") or [{}])[-1]
            console.say(why or watch.failed_line(p, attempt, os.path.join(p.workdir, runner.LOG)))
        failed += [] if ok else list(unit.points)
  except KeyboardInterrupt:
    for ref in pending:
      ray.cancel(ref)
    with contextlib.suppress(Exception):
      ray.wait(list(pending), num_returns=len(pending), timeout=300)
    raise
  return sorted(failed, key=lambda p: p.index)


def _resources_text(resources: Resources) -> str:
  parts = [f"{resources.num_cpus:g} CPU"]
  parts += [f"{resources.num_gpus:g} GPU"] if resources.num_gpus else []
  parts += [f"{resources.tpu:g} TPU"] if resources.tpu else []
  return ", ".join(parts)


def _outcome(ray: Any, ref: Any, name: str) -> tuple[bool, str]:
  """(succeeded, a line saying why not when Ray gave up on the task)."""
  try:
    return bool(ray.get(ref)), ""
  except ray.exceptions.RayTaskError as e:
    cause = e.cause if isinstance(e.cause, BaseException) else e
    first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    return False, f"{name}: FAILED after its retries: {first}"
  except ray.exceptions.RayError as e:  # its worker or node died more often than max_retries
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return False, f"{name}: FAILED after its retries ({type(e).__name__}): {first}"


@contextlib.contextmanager
def cluster(address: str, num_cpus: int | None, what: str = "--launcher=ray") -> Iterator[Any]:
  """connect() for the block, then ray.shutdown() (the local Ray stops; a cluster stays up)."""
  ray = connect(address, num_cpus, what)
  try:
    yield ray
  finally:
    ray.shutdown()


def submitted_to(address: str) -> str:
  """'the Ray cluster at ADDRESS' or 'a local Ray on 127.0.0.1'."""
  return f"the Ray cluster at {address}" if address else "a local Ray on 127.0.0.1"


@dataclasses.dataclass(frozen=True)
class Asha:
  """ASHA's settings: the metric of the in-training evaluations (eval/<name>; dev/<name> is read
  as eval/<name>), its direction, the first rung (training steps) and the reduction factor."""
  metric: str = "eval/loss"
  mode: str = "min"
  grace_steps: int = 1
  reduction_factor: float = 2.0

  @property
  def logged_key(self) -> str:
    """The metric's key in metrics.jsonl."""
    return "eval/" + self.metric.split("/", 1)[1] if self.metric.startswith("dev/") else self.metric


def evaluations(point: Point, key: str, after: int) -> list[dict[str, Any]]:
  """The point's logged evaluations of `key` after step `after`, one per step (the first logged;
  a resumed run logs again the steps after its checkpoint)."""
  rows, seen = [], after
  for row in watch.metrics_rows(point.workdir):
    if row["step"] > seen and isinstance(row.get(key), (int, float)):
      rows.append(row)
      seen = row["step"]
  return rows


def write_stop_note(point: Point, step: int, asha: Asha, value: float) -> None:
  """runner.STOPPED in the point's workdir: stopped by ASHA at the rung `step`."""
  note = {"by": "asha", "step": step, "metric": asha.metric, "value": value}
  with open(os.path.join(point.workdir, runner.STOPPED), "w") as f:
    f.write(json.dumps(note) + "\n")


def trainable_class(points: Sequence[Point], commands: Commands, asha: Asha,
                    poll_seconds: float = 0.5) -> type:
  """A tune.Trainable whose trial `config['index']` runs that point; each step() returns its next
  evaluation {'step', 'metric'} with train.py paused (SIGSTOP) until Tune asks for the next one,
  so that ASHA's decision falls at the evaluation's step; cleanup() stops a running train.py (it
  saves a checkpoint). A point already done or stopped only replays its logged evaluations, so
  ASHA's rungs hold every point on a rerun; a point whose process was killed raises
  PointInterrupted once its evaluations are reported, and Tune runs the trial again."""
  from ray import tune  # pylint: disable=g-import-not-at-top  (an extra: only ASHA sweeps need it)
  by_index = {p.index: p for p in points}

  class PointTrial(tune.Trainable):
    """One sweep point as a Tune trial."""

    def setup(self, config: dict[str, Any]) -> None:
      self.point = by_index[config["index"]]
      self.last_step, self.value, self.replay = 0, None, None
      self.launch, self.ok, self.thread, self.started = TiedProcesses(), None, None, False

    def _start(self) -> None:
      """Starts the point's processes once (not for a point done or stopped by ASHA)."""
      if self.started:
        return
      self.started = True
      if runner.status(self.point, commands) != "done" and not runner.stopped_early(self.point):
        self.thread = threading.Thread(target=self._run, name="sweep-point", daemon=True)
        self.thread.start()

    def _run(self) -> None:
      if commands.cwd:
        os.chdir(commands.cwd)
      self.ok = runner.run_point(self.point, commands, self.launch)

    def running(self) -> bool:
      return self.thread is not None and self.thread.is_alive()

    def killed(self) -> bool:
      """True once the point's processes ended, killed or stopped short (not by this trial)."""
      return (self.thread is not None and not self.running() and not self.ok
              and interrupted(self.point))

    def step(self) -> dict[str, Any]:
      if self.replay is not None:  # resumed after a pause at a rung: that rung's result again
        result, self.replay = self.replay, None
        return result
      self._start()
      self.launch.resume()  # Tune asks for more: ASHA let the point continue
      while True:
        still = self.running()  # before reading: a process that ended has logged all it will
        rows = evaluations(self.point, asha.logged_key, self.last_step)
        if rows:
          self.last_step, self.value = rows[0]["step"], float(rows[0][asha.logged_key])
          last = self.last_step >= self.point.num_steps or (
              not still and len(rows) == 1 and not self.killed())
          if last and self.thread is not None:
            self.thread.join()  # the point's evaluation (eval.py) too
          elif still:
            self.launch.pause()  # until ASHA decides: it stops at this rung, not steps later
          return {"step": self.last_step, "metric": self.value, "done": last}
        if not still:
          if self.killed():
            raise PointInterrupted(f"{self.point.name}: a process was killed; retrying")
          return {"step": self.last_step, "done": True}
        time.sleep(poll_seconds)

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
      """Tune pauses the trial (then cleanup() stops train.py, which saves its own checkpoint):
      the last evaluation reported."""
      del checkpoint_dir  # the point's workdir holds its checkpoints
      return {"step": self.last_step, "metric": self.value}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
      """Resumed: the first step() reports the paused rung's result again, for ASHA to decide on
      before train.py starts again."""
      self.last_step, self.value = checkpoint["step"], checkpoint["metric"]
      if self.value is not None:
        self.replay = {"step": self.last_step, "metric": self.value, "done": False}

    def cleanup(self) -> None:
      self.launch.stop()
      if self.thread is not None:
        self.thread.join()

  return PointTrial


def stopped_line(point: Point) -> str:
  """'<name>: stopped by ASHA at step S (<metric> V)' from the point's note."""
  note = runner.stopped_early(point) or {}
  value = note.get("value")
  return (f"{point.name}: stopped by ASHA at step {note.get('step')} ({note.get('metric')} "
          + (f"{value:.4g})" if isinstance(value, (int, float)) else "?)"))


def run_asha(points: Sequence[Point], commands: Commands, resources: Resources, max_retries: int,
             asha: Asha, storage: str, console: watch.Console) -> list[Point]:
  """Runs every point as a trial under Ray Tune's ASHAScheduler (connect() first); returns the
  points that failed (neither trained to their end nor stopped by ASHA). Ctrl-C stops the trials
  (each train.py saves a checkpoint) and raises KeyboardInterrupt."""
  from ray import tune  # pylint: disable=g-import-not-at-top  (an extra: only ASHA sweeps need it)
  from ray.tune.schedulers import ASHAScheduler  # pylint: disable=g-import-not-at-top  (as tune)
  by_index = {p.index: p for p in points}

  class RecordingAsha(ASHAScheduler):
    """Ray Tune's ASHA, which promotes a point only against the results its rung holds: a point
    reaching a rung before the rung holds reduction-factor results, while other points may still
    reach it, is paused (its train.py saves and exits) instead of promoted unseen; Tune resumes
    it once no point waits to start, and ASHA then decides on it against the rung as it is.
    Writes a stopped point's note (the driver decides, so it writes it); Tune pickles it, so it
    prints rather than holding the console."""

    def __init__(self, **kwargs: Any) -> None:
      super().__init__(**kwargs)
      self.paused: dict[str, float] = {}  # trial id -> the rung it was paused at

    def rungs(self, trial: Any) -> dict[float, dict[str, float]]:
      """{rung's step: {trial id: its recorded result}} of the trial's bracket."""
      return dict(self._trial_info[trial.trial_id]._rungs)  # pylint: disable=protected-access

    def may_still_reach(self, controller: Any, trial: Any, rung: float) -> bool:
      """Whether a point other than `trial` may still report a result at `rung`: one not yet
      started (Tune makes a trial when it can start it) or one below the rung, running, waiting
      or paused."""
      trials = controller.get_trials()
      if len(trials) < len(points):
        return True
      for other in trials:
        if other is trial or other.status in ("TERMINATED", "ERROR"):
          continue
        if other.status == "PENDING" or (other.last_result or {}).get("step", 0) < rung:
          return True
      return False

    def decide(self, controller: Any, trial: Any, result: dict[str, Any]) -> str:
      rung = self.paused.pop(trial.trial_id, None)
      if rung is not None and "metric" in result:  # resumed: decide against the rung as it is
        bracket = self._trial_info[trial.trial_id]  # pylint: disable=protected-access
        cutoff = bracket.cutoff(self.rungs(trial)[rung])
        value = self._metric_op * result["metric"]  # pylint: disable=protected-access
        return self.STOP if cutoff is not None and value < cutoff else self.CONTINUE
      before = {r for r, recorded in self.rungs(trial).items() if trial.trial_id in recorded}
      action = super().on_trial_result(controller, trial, result)
      now = [r for r, recorded in self.rungs(trial).items()
             if trial.trial_id in recorded and r not in before]  # the rung it just reached
      if action == self.CONTINUE and now and not result.get("done"):
        factor = self._reduction_factor  # pylint: disable=protected-access
        if len(self.rungs(trial)[now[0]]) < factor and self.may_still_reach(controller, trial, now[0]):
          self.paused[trial.trial_id] = now[0]
          return self.PAUSE
      return action

    def on_trial_result(self, controller: Any, trial: Any, result: dict[str, Any]) -> str:
      action = self.decide(controller, trial, result)
      point = by_index[trial.config["index"]]
      if (action == self.STOP and not result.get("done") and "metric" in result
          and result["step"] < point.num_steps):
        write_stop_note(point, result["step"], asha, result["metric"])
        print(stopped_line(point), flush=True)
      return action

  os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # verbose=0 is then quiet: the sweep reports
  max_t = max(p.num_steps for p in points)
  scheduler = RecordingAsha(time_attr="step", metric="metric", mode=asha.mode, max_t=max_t,
                            grace_period=min(max(1, asha.grace_steps), max_t),
                            reduction_factor=asha.reduction_factor)
  trainable = tune.with_resources(trainable_class(points, commands, asha),
                                  resources.tune_resources())
  tuner = tune.Tuner(
      trainable, param_space={"index": tune.grid_search([p.index for p in points])},
      # No max_concurrent_trials: Tune's limiter counts a paused trial as running, so no point
      # would start while one waits at a rung. The resources cap the points that run at once
      # (a local Ray holds --parallel points' resources: sweep.py's run_on_ray).
      tune_config=tune.TuneConfig(scheduler=scheduler),
      run_config=tune.RunConfig(
          name="asha", storage_path=os.path.abspath(storage), verbose=0,
          failure_config=tune.FailureConfig(max_failures=max_retries)))
  for p in points:
    console.say(f"[{p.index + 1}/{len(points)}] {p.name}: {runner.status(p, commands)}"
                + (" (stopped by ASHA: replayed)" if runner.stopped_early(p) else ""))
  before = signal.getsignal(signal.SIGINT)
  tuner.fit()
  # Tune's own SIGINT handler stops the trials (each train.py saves) and puts `before` back; a
  # run it was not interrupted in ends with Tune's handler still installed.
  tune_interrupted = (threading.current_thread() is threading.main_thread()
                      and signal.getsignal(signal.SIGINT) is before
                      and os.environ.get("TUNE_DISABLE_SIGINT_HANDLER", "0") == "0")
  if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGINT, before)
  if tune_interrupted:
    raise KeyboardInterrupt
  failed = []
  for p in points:
    if runner.status(p, commands) == "done":
      console.say(watch.finished_line(p, commands.eval_split, None))
    elif runner.stopped_early(p):
      console.say(stopped_line(p))
    else:
      attempt = (runner.read_record(p).get("attempts") or [{}])[-1]
      console.say(watch.failed_line(p, attempt, os.path.join(p.workdir, runner.LOG)))
      failed.append(p)
  return failed
