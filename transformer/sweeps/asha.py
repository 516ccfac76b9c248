"""`--early_stop=asha`: the points of a sweep as trials of Ray Tune's ASHAScheduler.

A trial runs its point's processes (`runner.run_point`, through ray_launcher's TiedProcesses) and
reports each in-training evaluation in its metrics.jsonl: the rungs are evaluation steps. When
ASHA stops a trial its train.py gets SIGTERM, saves a checkpoint at its step and exits, and
`early_stop.json` in its workdir says where (the report's status). A point reaching a rung that
holds fewer than reduction-factor results is paused rather than promoted unseen (RecordingAsha).
A stopped point resumes when the sweep runs again without early stopping.

Ray is imported here and in ray_launcher only, inside functions, so that a plain install runs
every other sweep.
"""

import dataclasses
import json
import os
import signal
import threading
import time
from typing import Any, Sequence

from transformer.sweeps import runner, watch
from transformer.sweeps.ray_launcher import interrupted, PointInterrupted, Resources, TiedProcesses
from transformer.sweeps.spec import Commands, Point


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


def may_still_reach(trials: Sequence[Any], total: int, trial: Any, rung: float) -> bool:
  """Whether a point other than `trial` may still report a result at `rung`: one without a trial
  yet (Tune makes a trial when it can start it; `total` points in all) or one below the rung,
  running, waiting or paused."""
  if len(trials) < total:
    return True
  for other in trials:
    if other is trial or other.status in ("TERMINATED", "ERROR"):
      continue
    if other.status == "PENDING" or (other.last_result or {}).get("step", 0) < rung:
      return True
  return False


def scheduler_class(points: Sequence[Point], asha: Asha) -> type:
  """Ray Tune's ASHAScheduler, subclassed: see RecordingAsha."""
  from ray.tune.schedulers import ASHAScheduler  # pylint: disable=g-import-not-at-top  (an extra)
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
        if (len(self.rungs(trial)[now[0]]) < factor
            and may_still_reach(controller.get_trials(), len(points), trial, now[0])):
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

  return RecordingAsha


def run_asha(points: Sequence[Point], commands: Commands, resources: Resources, max_retries: int,
             asha: Asha, storage: str, console: watch.Console) -> list[Point]:
  """Runs every point as a trial under Ray Tune's ASHAScheduler (connect() first); returns the
  points that failed (neither trained to their end nor stopped by ASHA). Ctrl-C stops the trials
  (each train.py saves a checkpoint) and raises KeyboardInterrupt."""
  from ray import tune  # pylint: disable=g-import-not-at-top  (an extra: only ASHA sweeps need it)
  os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # verbose=0 is then quiet: the sweep reports
  max_t = max(p.num_steps for p in points)
  scheduler = scheduler_class(points, asha)(
      time_attr="step", metric="metric", mode=asha.mode, max_t=max_t,
      grace_period=min(max(1, asha.grace_steps), max_t), reduction_factor=asha.reduction_factor)
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
  started = time.time()
  fit(tuner)
  return report(points, commands, console, announced_since=started)


def fit(tuner: Any) -> None:
  """tuner.fit(); KeyboardInterrupt if Ctrl-C stopped it. Tune's own SIGINT handler stops the
  trials (each train.py saves) and puts the previous handler back; a run it was not interrupted
  in ends with Tune's handler still installed."""
  before = signal.getsignal(signal.SIGINT)
  tuner.fit()
  main = threading.current_thread() is threading.main_thread()
  tune_interrupted = (main and signal.getsignal(signal.SIGINT) is before
                      and os.environ.get("TUNE_DISABLE_SIGINT_HANDLER", "0") == "0")
  if main:
    signal.signal(signal.SIGINT, before)
  if tune_interrupted:
    raise KeyboardInterrupt


def report(points: Sequence[Point], commands: Commands, console: watch.Console,
           announced_since: float | None = None) -> list[Point]:
  """Says how each point ended (done, stopped by ASHA, failed), but not a stop whose note was
  written after `announced_since` (the scheduler printed it then); returns the failed ones."""
  failed = []
  for p in points:
    if runner.status(p, commands) == "done":
      console.say(watch.finished_line(p, commands.eval_split, None))
    elif runner.stopped_early(p):
      note = os.path.join(p.workdir, runner.STOPPED)
      if announced_since is None or os.path.getmtime(note) < announced_since:
        console.say(stopped_line(p))
    else:
      attempt = (runner.read_record(p).get("attempts") or [{}])[-1]
      console.say(watch.failed_line(p, attempt, os.path.join(p.workdir, runner.LOG)))
      failed.append(p)
  return failed
