"""Sweeps on a Ray cluster: each unit of work (a list of points that one train.py command trains;
one point today) is a Ray task that runs the same processes as the local launcher.

The task asks for the unit's resources (CPUs, GPUs, the `TPU` resource Ray gives a TPU host),
runs `runner.run_point` on whichever node Ray picks, and is retried (`max_retries`) when its node
or worker dies or its train.py is killed: the rerun resumes from the point's checkpoint, as
train.py resumes from its workdir. Every node sees the same paths: this checkout, the Python
environment and the sweep's workdir (a shared filesystem). The driver collects nothing from the
tasks but their success: the report reads the workdirs, as for a local sweep.

`--early_stop=asha` runs the points as trials of Ray Tune's ASHAScheduler instead (asha.py, which
uses this module's processes and cluster connection).

Ray is imported here and in asha.py only, inside functions, so that a plain install runs every
other sweep.
"""

import contextlib
import ctypes
import dataclasses
import os
import re
import signal
import shlex
import socket
import subprocess
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
  """SweepError unless `address` is HOST:PORT, 'auto' or ray://HOST:PORT and, for HOST:PORT, a
  TCP connection to it opens within `timeout` (the others are left to Ray)."""
  if address == "auto" or re.match(r"^ray://[^\s/:]+:\d+$", address):
    return
  match = re.match(r"^([^\s:/]+):(\d+)$", address)
  if not match or not 0 < int(match[2]) < 65536:
    raise SweepError(f"--ray_address={address} is not HOST:PORT with a port in 1..65535 (e.g. "
                     "10.0.0.2:6379, the head's `ray start --head --port`), 'auto' or "
                     "ray://HOST:PORT")
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
      # address="local": a Ray of its own, whatever cluster (live or stale) this machine has
      ray.init(address="local", _node_ip_address="127.0.0.1", num_cpus=num_cpus,
               include_dashboard=False, runtime_env=runtime_env, log_to_driver=False,
               logging_level="ERROR")
  except (ConnectionError, RuntimeError, ValueError) as e:
    where = f"--ray_address={address}" if address else "a local Ray"
    # Ray 2.60's `ray start` turns token authentication on; a client must be in the same mode.
    hint = ("; a cluster that `ray start` started wants token authentication: export "
            "RAY_AUTH_MODE=token (docs/sweeps.md#ray)"
            if address and os.environ.get("RAY_AUTH_MODE") != "token" else "")
    raise SweepError(f"{where}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}"
                     f"{hint}") from None
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
