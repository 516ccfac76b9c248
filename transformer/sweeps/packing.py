"""Packing a sweep's points into `train.members` programs (`sweep.py --pack=N`).

Points whose configs differ only in keys a member may vary (members.MEMBER_KEYS) and that would
start from the same checkpoint step (none, for new points) are grouped, at most N to a pack, in
the sweep file's order. A pack trains as one `train.py --config.train.members=...` process in
`<sweep workdir>/packs/<pack name>`; each member's directory there is a symlink to its point's
workdir, so the point's config.json, metrics, checkpoints and train_done.json land where an
unpacked run puts them and evaluation, results.md and resume read them as usual. A pack's name
is a digest of its points' names: a rerun that groups the same unfinished points resumes the
same pack, and a point finished meanwhile (e.g. unpacked) is trained no more, so it leaves its
pack (the others resume from their checkpoints in a pack of their own).
"""

import dataclasses
import functools
import hashlib
import json
import os
import shlex
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import ml_collections

from transformer import files
from transformer.keyspec import flat_items
from transformer.sweeps import runner, watch
from transformer.sweeps.spec import apply_overrides, Commands, format_value, Point
from transformer.train import members

PACKS_DIR = "packs"  # under the sweep's workdir: one directory per pack


def structure(flat: Mapping[str, Any]) -> str:
  """What a pack's members must share: every key of a flat config but the MEMBER_KEYS."""
  return json.dumps({k: v for k, v in flat.items() if k not in members.MEMBER_KEYS},
                    sort_keys=True, default=str)


def packable(flat: Mapping[str, Any]) -> bool:
  """True if a point of this flat config may train as a member: members.unsupported says nothing
  and it trains no members of its own."""
  return (not members.unsupported(flat.get("parallel.mode"), flat.get("train.early_stop_patience"))
          and not str(flat.get("train.members", "")).strip())


def group(configs: Sequence[Mapping[str, Any]], starts: Sequence[Any], limit: int
          ) -> list[list[int]]:
  """Indices of `configs` (flat dicts) grouped in order: a group shares its structure and its
  start (latest checkpoint step, None if new), holds at most `limit`, never two equal configs;
  an unpackable config stays alone."""
  groups: list[list[int]] = []
  open_by_key: dict[tuple[str, Any], list[list[int]]] = {}
  for i, flat in enumerate(configs):
    if limit < 2 or not packable(flat):
      groups.append([i])
      continue
    candidates = open_by_key.setdefault((structure(flat), starts[i]), [])
    same = lambda g: any(dict(configs[j]) == dict(flat) for j in g)  # noqa: E731
    target = next((g for g in candidates if len(g) < limit and not same(g)), None)
    if target is None:
      target = []
      candidates.append(target)
      groups.append(target)
    target.append(i)
  return groups


def varying(configs: Sequence[Mapping[str, Any]]) -> list[str]:
  """The MEMBER_KEYS whose values differ between the flat configs, in MEMBER_KEYS' order."""
  return [k for k in members.MEMBER_KEYS if len({json.dumps(c.get(k)) for c in configs}) > 1]


@dataclasses.dataclass(frozen=True)
class Pack:
  """Points trained as one train.members program."""
  name: str
  workdir: str
  points: tuple[Point, ...]
  keys: tuple[str, ...]  # the member keys that differ between its points
  member_overrides: tuple[dict[str, Any], ...]  # each point's values of `keys`

  @property
  def member_names(self) -> list[str]:
    """Each point's member directory name (members.member_name)."""
    return [members.member_name(o) for o in self.member_overrides]

  def members_spec(self) -> str:
    """The train.members value: each point's `keys` as key=value, members split by ';'."""
    return ";".join(",".join(f"{k}={format_value(v)}" for k, v in o.items())
                    for o in self.member_overrides)

  def train_argv(self, commands: Commands) -> list[str]:
    """train.py in the pack's workdir: the first point's overrides but the varying keys, and
    train.members giving each point's."""
    first = self.points[0]
    shared = Point(first.index, {k: v for k, v in first.overrides.items() if k not in self.keys},
                   self.name, self.workdir, first.num_steps)
    return commands.train(shared, self.workdir, extra={"train.members": self.members_spec()})


def flat_config(config: ml_collections.ConfigDict, point: Point,
                commands: Commands) -> dict[str, Any]:
  """The point's config (the sweep's config, its sweep-wide and its own overrides), flat."""
  return flat_items(apply_overrides(config, commands.overrides(point)))


def plan(config: ml_collections.ConfigDict, points: Sequence[Point], commands: Commands,
         limit: int, workdir: str) -> tuple[list[Pack], list[Point]]:
  """(packs of >= 2 points, the points trained alone) of the points still to train."""
  todo = [p for p in points if runner.status(p, commands) in ("new", "resume")]
  flats = [flat_config(config, p, commands) for p in todo]
  starts = [runner.latest_checkpoint(p) for p in todo]
  packs, alone = [], []
  for indices in group(flats, starts, limit):
    if len(indices) == 1:
      alone.append(todo[indices[0]])
      continue
    chosen = [flats[i] for i in indices]
    keys = varying(chosen)
    overrides = tuple({k: members.MEMBER_KEYS[k](c[k]) for k in keys} for c in chosen)
    names = [todo[i].name for i in indices]
    name = "pack-" + hashlib.sha1("\n".join(names).encode()).hexdigest()[:8]
    packs.append(Pack(name, os.path.join(workdir, PACKS_DIR, name),
                      tuple(todo[i] for i in indices), tuple(keys), overrides))
  return packs, alone


def link_members(pack: Pack) -> None:
  """Creates the pack's workdir with each member's directory a symlink to its point's workdir."""
  files.makedirs(pack.workdir)
  for p, name in zip(pack.points, pack.member_names):
    os.makedirs(p.workdir, exist_ok=True)
    link, target = os.path.join(pack.workdir, name), os.path.relpath(p.workdir, pack.workdir)
    if os.path.islink(link) and os.readlink(link) == target:
      continue
    if os.path.lexists(link):
      os.remove(link)
    os.symlink(target, link)


def train_pack(pack: Pack, commands: Commands, launch: runner.Launch = runner.launch_subprocess
               ) -> list[Point]:
  """Trains a pack (records in each point's sweep_point.json, its output in the pack's
  sweep.log); returns its points that did not finish training."""
  link_members(pack)
  log_path = os.path.join(pack.workdir, runner.LOG)
  records = []
  for p in pack.points:
    record = runner.read_record(p) | {"name": p.name, "overrides": p.overrides,
                                      "run": runner.point_run(p, commands), "pack": pack.name}
    runner.write_record(p, record)
    records.append(record)
    with open(os.path.join(p.workdir, runner.LOG), "a") as log:
      log.write(f"# trained in {pack.name} with {len(pack.points) - 1} other point(s); its "
                f"output: {log_path}\n")
  argv = pack.train_argv(commands)
  start = time.time()
  code = launch(argv, log_path, commands.cwd)
  seconds = time.time() - start
  unfinished = []
  for p, record in zip(pack.points, records):
    result = code
    if code == 0 and runner.trained_step(p) is None:
      result = "stopped before train.num_steps"
    record["train_seconds"] = record.get("train_seconds", 0.0) + seconds
    record.setdefault("attempts", []).append(
        {"stage": "train", "pack": pack.name, "argv": list(argv), "returncode": result,
         "seconds": round(seconds, 3), "finished": time.strftime("%Y-%m-%dT%H:%M:%S")})
    runner.write_record(p, record)
    if result != 0:
      unfinished.append(p)
  return unfinished


def unit_runner(packs: Sequence[Pack]) -> Callable[[Any, Commands, runner.Launch], bool]:
  """A Ray task's body for units of these packs and of single points (ray_launcher.run's
  run_unit): a pack trains as one program, then each of its points (or a single point) runs as
  runner.run_point does, so a trained point only evaluates; True if every point succeeded."""
  return functools.partial(_run_unit, {k.name: k for k in packs})


def _run_unit(packs: Mapping[str, Pack], unit: Any, commands: Commands,
              launch: runner.Launch) -> bool:
  pack = packs.get(unit.name)
  if pack is not None and train_pack(pack, commands, launch):
    return False
  return runner.run_points(unit.points, commands, launch)


def dry_run_lines(packs: Sequence[Pack], alone: Sequence[Point], points: Sequence[Point],
                  commands: Commands, limit: int) -> list[str]:
  """The grouping and the commands a packed run would start (evaluations after training)."""
  packed = sum(len(k.points) for k in packs)
  lines = [f"# --pack={limit}: {packed} points to train in {len(packs)} pack(s), "
           f"{len(alone)} alone"]
  for k in packs:
    lines.append(f"# {k.name}: {', '.join(p.name for p in k.points)} (members differ in "
                 f"{', '.join(k.keys)}; workdir {k.workdir})")
    lines.append(shlex.join(k.train_argv(commands)))
    if commands.has_eval():
      lines += [shlex.join(commands.eval(p)) for p in k.points]
  in_packs = {p.name for k in packs for p in k.points}
  return lines + runner.dry_run_lines([p for p in points if p.name not in in_packs], commands,
                                      [(len(k.points), k.points[0].num_steps) for k in packs])


def run(config: ml_collections.ConfigDict, points: Sequence[Point], commands: Commands,
        limit: int, workdir: str, parallel: int = 1,
        launch: runner.Launch = runner.launch_subprocess,
        console: watch.Console | None = None) -> list[Point]:
  """Trains the packs (`parallel` at a time), then runs the rest as runner.run does (the packed
  points' evaluations, the points alone); returns the points that failed. A signal stops the
  packs as runner.run stops points (KeyboardInterrupt after they saved)."""
  runner.check_same_runs(points, commands)
  console = console or watch.Console(print)
  packs, _ = plan(config, points, commands, limit, workdir)
  lock, failed = threading.Lock(), []

  def one(pack: Pack) -> None:
    console.say(f"{pack.name}: training {len(pack.points)} points as members "
                f"({', '.join(p.name for p in pack.points)})")
    for p in pack.points:
      console.running(p, "train")
    start = time.time()
    try:
      unfinished = train_pack(pack, commands, launch)
    finally:
      for p in pack.points:
        console.ended(p)
    with lock:
      log = os.path.join(pack.workdir, runner.LOG)
      if runner.stop_signal() is not None and unfinished:
        console.say(f"{pack.name}: stopped; its points resume from their checkpoints")
      elif unfinished:
        attempt = runner.read_record(unfinished[0]).get("attempts", [{}])[-1]
        for p in unfinished:
          console.say(watch.failed_line(p, attempt, log))
      else:
        console.say(f"{pack.name}: trained in {watch.duration(time.time() - start)}")
      failed.extend(unfinished)

  runner.reset_stop()
  runner.run_each(packs, one, parallel, console)
  names = {p.name for p in failed}
  rest = runner.run([p for p in points if p.name not in names], commands, parallel, launch,
                    console=console)
  return sorted(failed + rest, key=lambda p: p.index)
