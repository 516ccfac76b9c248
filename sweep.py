r"""Runs a sweep: `python sweep.py --config=configs/g2p.py:small --sweep=configs/sweeps/positional.py
--workdir=runs/sweep_pos [--parallel=N] [--dry_run] [--report_only] [--config.train.num_steps=...]`.

Every point of the sweep file (configs/sweeps/*.py: `get_sweep()` -> list of override dicts) runs
as its own `python train.py` process, then `python eval.py --split=test`, in its own workdir
`<workdir>/<name from its overrides>` (e.g. `runs/sweep_pos/positional=rope`). `--config.*` flags
given here apply to every point. All keys and every point's config are validated before anything
runs. While points run, the console shows a line per running point (step, loss, in-training
metric, ETA; redrawn every 2 s on a terminal, else a line every 30 s when its step moved), and a
line when a point finishes or fails (its exit code, its sweep.log, that log's last error line).
At the end (or with --report_only) it writes `<workdir>/results.csv`, `results.md`,
`results.png` (--metric per point) and `curves.png` (learning curves overlaid).

Ctrl-C, SIGTERM or SIGHUP stops it: nothing new starts, the running points (each in its own
process group, so only the sweep decides what they receive) get the SIGINT or SIGTERM, save a
checkpoint at their current step and exit; the sweep waits for them, prints where each stopped and
the command that resumes, and ends killed by the signal it got (a second Ctrl-C is passed on too:
the points then exit at once, without saving). Rerunning the command skips finished points and
resumes interrupted ones from their checkpoints.

With --pack=N, points that differ only in keys a `train.members` member may vary (seed, learning
rate, label smoothing, dropout rates, weight decay, warmup, Adam's betas, z-loss, clipping) and
start from the same step train N at a time as one vmapped program in `<workdir>/packs/<pack>`,
each member's directory a link to its point's workdir (transformer/sweeps/packing.py); the dry
run prints the grouping. Everything else (evaluation, report, resume) is as without it.

On cloud TPU VMs: `--launcher=tpu_vm --tpu_name=NAME --zone=ZONE --bucket=gs://B` prints one
`gcloud compute tpus tpu-vm ssh NAME --zone=ZONE --worker=all --command="..."` per point, with the
workdir and data_dir under the bucket, and last the command that copies the results back and
writes the report; `--execute` also runs the points, one after the other. Each point's command
skips it when it is done, as a local rerun does.

On a Ray cluster: `--launcher=ray --ray_address=HEAD:PORT` runs each point (or pack) as a Ray task holding
--ray_num_cpus/--ray_num_gpus/--ray_tpu, retried (--ray_max_retries) when its node, worker or
train.py dies, resuming from its checkpoint; every node needs this checkout, its environment and
the sweep's workdir at the same paths. `--early_stop=asha` runs the points under Ray Tune's ASHA
on their in-training evaluations (--asha_metric); a stopped point keeps its checkpoint, its row
says where it stopped, and a rerun without --early_stop continues it (docs/sweeps.md#ray).
"""

import functools
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from transformer import cli

ROOT = os.path.dirname(os.path.abspath(__file__))

config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/g2p.py:small.",
                                 lock_config=True)
flags.DEFINE_string("sweep", None, "Sweep file, e.g. configs/sweeps/positional.py.")
flags.DEFINE_string("workdir", None, "The sweep's directory; each point gets a subdirectory.")
flags.DEFINE_integer("parallel", 1, "Points trained at the same time (each is one process).",
                     lower_bound=1)
flags.DEFINE_integer("pack", 1, "Train up to N points that differ only in keys a train.members "
                     "member may vary (seed, learning rate, ...) as one vmapped program; 1 = off.",
                     lower_bound=1)
flags.DEFINE_bool("dry_run", False, "Print the commands that would run, run nothing.")
flags.DEFINE_bool("report_only", False, "Only write results.csv/.md and the plots.")
flags.DEFINE_string("metric", "auto", "Metric for the bar plot and the bold best value, e.g. "
                    "test/wer or dev/loss; auto = test/wer, test/bleu, ..., dev/loss.")
flags.DEFINE_string("eval_split", "test", "Split eval.py evaluates after training; '' = none.")
flags.DEFINE_string("python", sys.executable, "Python interpreter for the local processes.")
flags.DEFINE_enum("launcher", "local", ["local", "tpu_vm", "ray"], "Where the points run.")
flags.DEFINE_string("tpu_name", None, "tpu_vm: the TPU VM's name.")
flags.DEFINE_string("zone", None, "tpu_vm: the TPU VM's zone, e.g. us-central2-b.")
flags.DEFINE_string("bucket", None, "tpu_vm: gs:// path holding workdirs and tensorflow_datasets.")
flags.DEFINE_string("project", "", "tpu_vm: the GCP project ('' = gcloud's default).")
flags.DEFINE_string("remote_dir", "~/transformer", "tpu_vm: this repository's path on the VMs.")
flags.DEFINE_string("remote_python", "python3", "tpu_vm: Python interpreter on the VMs.")
flags.DEFINE_bool("execute", False, "tpu_vm: run the gcloud commands instead of printing them.")
flags.DEFINE_string("ray_address", "", "ray: the cluster's address, e.g. 10.0.0.2:6379 (the head's "
                    "`ray start --head --port`); '' = a local Ray on 127.0.0.1.")
flags.DEFINE_float("ray_num_cpus", 1, "ray: CPUs each point holds while it runs.", lower_bound=0)
flags.DEFINE_float("ray_num_gpus", 0, "ray: GPUs each point holds while it runs.", lower_bound=0)
flags.DEFINE_float("ray_tpu", 0, "ray: TPU chips (Ray's `TPU` resource) each point holds.",
                   lower_bound=0)
flags.DEFINE_integer("ray_max_retries", 3, "ray: reruns of a point whose node, worker or process "
                     "died (each resumes from its checkpoint).", lower_bound=0)
flags.DEFINE_enum("early_stop", "none", ["none", "asha"], "Early stopping over the points: asha = "
                  "Ray Tune's ASHA on the in-training evaluations (a local Ray unless "
                  "--launcher=ray); stopped points keep a checkpoint and resume without it.")
flags.DEFINE_string("asha_metric", "eval/loss", "asha: the evaluation metric, e.g. eval/wer.")
flags.DEFINE_enum("asha_mode", "min", ["min", "max"], "asha: whether lower or higher is better.")
flags.DEFINE_integer("asha_grace_steps", 0, "asha: the first rung in training steps; 0 = the "
                     "config's eval.every_steps (the first evaluation).")
flags.DEFINE_float("asha_reduction_factor", 2, "asha: 1/fraction of the points kept at each rung.")
flags.mark_flags_as_required(["config", "sweep", "workdir"])
for _name in ("ray_num_cpus", "ray_num_gpus", "ray_tpu", "asha_reduction_factor"):
  flags.register_validator(_name, math.isfinite, message="must be a finite number")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  cli.quiet_logging()
  from transformer.sweeps import runner, spec  # pylint: disable=g-import-not-at-top
  from transformer.config import ConfigError  # pylint: disable=g-import-not-at-top
  try:
    with cli.one_line_errors(spec.SweepError, ConfigError):
      run_sweep()
  except KeyboardInterrupt:  # run() has stopped the running points and waited for them
    sig = runner.stop_signal() or signal.SIGINT
    print(f"interrupted ({signal.Signals(sig).name}); resume with: "
          f"{shlex.join(['python', 'sweep.py', *sys.argv[1:]])}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    signal.signal(sig, signal.SIG_DFL)  # end as killed by it, as a shell expects (loops stop)
    os.kill(os.getpid(), sig)


def run_sweep() -> None:
  """Plans the sweep, runs (or prints) its points and writes the report."""
  from transformer.sweeps import runner, spec  # pylint: disable=g-import-not-at-top
  from transformer.config import ConfigError  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  config_arg = config_flags.get_config_filename(f["config"])
  base = dict(config_flags.get_override_values(f["config"]))
  on_ray = f.launcher == "ray" or f.early_stop != "none"
  try:  # on Ray, absolute workdirs: each node runs in its own working directory
    points = spec.plan(f.config, config_arg, f.sweep,
                       os.path.abspath(f.workdir) if on_ray else f.workdir)
  except (spec.SweepError, ConfigError) as e:
    cli.fail(str(e))
  check_settings(points)
  script = lambda name: os.path.relpath(os.path.join(ROOT, name))  # pylint: disable=unnecessary-lambda-assignment
  commands = spec.Commands(config_arg, base, python=f.python, train_script=script("train.py"),
                             eval_script=script("eval.py"), eval_split=f.eval_split)

  if f.pack > 1 and (f.launcher == "tpu_vm" or f.early_stop != "none"):
    cli.fail(f"--pack={f.pack} needs --launcher=local or --launcher=ray, without --early_stop")
  if f.launcher == "tpu_vm":
    if f.early_stop != "none":
      cli.fail(f"--early_stop={f.early_stop} needs --launcher=local or --launcher=ray")
    missing = [n for n in ("tpu_name", "zone", "bucket") if not f[n].value]
    if missing:
      cli.fail(f"--launcher=tpu_vm needs {', '.join('--' + n for n in missing)}")
    try:
      launches = [spec.tpu_vm_command(p, commands, f.tpu_name, f.zone, f.bucket, f.remote_dir,
                                        f.remote_python, f.project) for p in points]
    except spec.SweepError as e:
      cli.fail(str(e))
    for p, (cmd, line) in zip(points, launches):
      print(f"# {p.name}\n{line}", flush=True)
      if f.execute and subprocess.run(cmd, check=False).returncode != 0:
        cli.fail(f"point {p.name} failed on {f.tpu_name}")
    local = os.path.normpath(f.workdir)
    print("# then copy the results back (without checkpoints) and write the report:")
    print(f"gcloud storage rsync -r -x {shlex.quote('.*/checkpoints/.*')} "
          f"{f.bucket.rstrip('/')}/{local.lstrip('/')} {local}"
          f" && python sweep.py {shlex.join(report_flags())} --report_only")
    return

  try:  # a point's workdir holding a run of other overrides: refused, never counted as done
    runner.check_same_runs(points, commands)
  except spec.SweepError as e:
    cli.fail(str(e))
  if f.pack > 1:
    from transformer.sweeps import packing  # pylint: disable=g-import-not-at-top  (imports JAX)
  if f.dry_run:
    if f.pack > 1:
      packs, alone = packing.plan(f.config, points, commands, f.pack, f.workdir)
      print("\n".join(packing.dry_run_lines(packs, alone, points, commands, f.pack)))
    else:
      print("\n".join(runner.dry_run_lines(points, commands)))
    return
  if on_ray and not f.report_only:
    from transformer.sweeps import ray_launcher  # pylint: disable=g-import-not-at-top
    try:
      ray_launcher.preflight(f.ray_address if f.launcher == "ray" else "",
                             "--launcher=ray" if f.launcher == "ray" else "--early_stop=asha")
    except spec.SweepError as e:
      cli.fail(str(e))
  failed = []
  if not f.report_only:
    runner.write_manifest(points, commands, f.sweep, f.workdir)
    pending = [p for p in points if runner.status(p, commands) != "done"]
    if (f.parallel > 1 or on_ray) and pending:
      try:
        runner.prepare_data(f.config, pending)
      except (ValueError, OSError) as e:  # ConfigError is a ValueError
        cli.fail(f"preparing the data: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    from transformer.sweeps import watch  # pylint: disable=g-import-not-at-top
    terminal = sys.stdout.isatty()  # status lines redrawn in place; in a log, plain lines
    console = watch.Console(functools.partial(print, flush=True), every=2.0 if terminal else 30.0,
                            stream=sys.stdout if terminal else None)
    if on_ray:
      failed = run_on_ray(points, commands, console)
    elif f.pack > 1:
      failed = packing.run(f.config, points, commands, f.pack, f.workdir, parallel=f.parallel,
                           console=console)
    else:
      failed = runner.run(points, commands, parallel=f.parallel, console=console)
  write_report(points)
  if failed:
    cli.fail(f"{len(failed)} point(s) failed: {', '.join(p.name for p in failed)}")


def write_report(points) -> None:
  """Writes the sweep's report (transformer/sweeps/report.py) and prints its tables."""
  from transformer.sweeps import report  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  title = f"`python sweep.py {shlex.join(report_flags())}`"
  out = report.write_report(points, f.workdir, f.metric, f.eval_split, title=title)
  if f.metric != "auto" and not any(f.metric in r for r in out["rows"]):
    print(f"warning: --metric={f.metric}: no point has it yet; nothing is bolded or plotted",
          file=sys.stderr)
  print(out["markdown"])
  print("wrote " + ", ".join(out[k] for k in ("csv", "md", "plot", "curves") if k in out))


def check_settings(points) -> None:
  """Ends the program in one line, before anything runs, for settings or points that cannot
  work: each point as train.py's start checks it, --metric, ASHA's settings, --python."""
  f = flags.FLAGS
  if not f.report_only:
    check_points(points)
  check_metric(points)
  check_asha(points)
  if f.launcher == "local" and not f.report_only and shutil.which(f.python) is None:
    cli.fail(f"--python={f.python}: no such executable (the interpreter the points run with)")


def check_points(points) -> None:
  """Ends the program in one line, before anything runs, for a point train.py would refuse at its
  start (start.check_loop_config: W&B's mode and credentials, a metric never logged, ...)."""
  from transformer.config import ConfigError, from_configdict  # pylint: disable=g-import-not-at-top
  from transformer.sweeps import spec  # pylint: disable=g-import-not-at-top
  from transformer.train import start  # pylint: disable=g-import-not-at-top  (imports JAX)
  for p in points:
    try:
      start.check_loop_config(from_configdict(spec.apply_overrides(flags.FLAGS.config,
                                                                   p.overrides)))
    except ConfigError as e:
      cli.fail(f"{e} (point {p.name})")


def check_metric(points) -> None:
  """Ends the program in one line for a --metric no point's report row can hold: dev/<name> that
  the in-training evaluations never log, another prefix than dev/ and the evaluated split's."""
  f = flags.FLAGS
  if f.metric == "auto" or "/" not in f.metric:
    return  # 'auto', or a column such as tokens_per_sec
  prefix, split = f.metric.split("/", 1)[0], f.eval_split or "test"
  if prefix != "dev" and prefix != split:
    cli.fail(f"--metric={f.metric}: the report's metrics are dev/<name> (in-training "
             f"evaluations) and {split}/<name> (eval.py's, --eval_split)")
  if prefix == "dev":
    from transformer.config import ConfigError, from_configdict  # pylint: disable=g-import-not-at-top
    from transformer.model import scoring  # pylint: disable=g-import-not-at-top  (imports JAX)
    from transformer.sweeps import spec  # pylint: disable=g-import-not-at-top
    for p in points:
      try:
        scoring.check_in_training_metric(
            from_configdict(spec.apply_overrides(f.config, p.overrides)), "--metric", f.metric)
      except ConfigError as e:
        cli.fail(f"{e} (point {p.name})")


def check_asha(points) -> None:
  """Ends the program in one line, before anything runs, for ASHA settings no point can meet: a
  metric some point's in-training evaluations never log, a mode against the metric's direction
  (max of a loss), a reduction factor <= 1."""
  f = flags.FLAGS
  if f.early_stop != "asha":
    return
  from transformer import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  from transformer.config import ConfigError, from_configdict  # pylint: disable=g-import-not-at-top
  from transformer.model import scoring  # pylint: disable=g-import-not-at-top  (imports JAX)
  from transformer.sweeps import spec  # pylint: disable=g-import-not-at-top
  if not f.asha_reduction_factor > 1:
    cli.fail(f"--asha_reduction_factor={f.asha_reduction_factor} must be > 1 (1/fraction of the "
             "points kept at each rung)")
  if f.asha_grace_steps < 0:
    cli.fail(f"--asha_grace_steps={f.asha_grace_steps} must be >= 0")
  for p in points:
    try:
      scoring.check_in_training_metric(from_configdict(spec.apply_overrides(f.config, p.overrides)),
                                       "--asha_metric", f.asha_metric)
    except ConfigError as e:
      cli.fail(f"{e} (point {p.name})")
  better = metrics_lib.better_mode(f.asha_metric)  # None: a metric of no known direction
  if better not in (None, f.asha_mode):
    cli.fail(f"--asha_mode={f.asha_mode} for --asha_metric={f.asha_metric!r}: "
             f"{'higher' if better == 'max' else 'lower'} is better; give --asha_mode={better}")


def run_on_ray(points, commands, console) -> list:
  """Runs the points as Ray tasks (--launcher=ray) or ASHA trials (--early_stop); the failed."""
  from transformer.sweeps import ray_launcher, runner  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  resources = ray_launcher.Resources(f.ray_num_cpus, f.ray_num_gpus, f.ray_tpu)
  address = f.ray_address if f.launcher == "ray" else ""
  what = "--launcher=ray" if f.launcher == "ray" else f"--early_stop={f.early_stop}"
  commands = ray_launcher.ray_commands(commands)
  local_cpus = None if address else max(1, int(f.parallel * max(resources.num_cpus, 1)))
  with ray_launcher.cluster(address, local_cpus, what):
    console.say(f"running on {ray_launcher.submitted_to(address)}")
    if f.early_stop == "asha":
      from transformer.sweeps import asha  # pylint: disable=g-import-not-at-top
      settings = asha.Asha(f.asha_metric, f.asha_mode,
                           f.asha_grace_steps or f.config.eval.every_steps, f.asha_reduction_factor)
      return asha.run_asha(points, commands, resources, f.ray_max_retries, settings,
                           os.path.join(f.workdir, "ray_tune"), console)
    todo = []
    for p in points:
      state = runner.status(p, commands)
      console.say(f"[{p.index + 1}/{len(points)}] {p.name}: {state}"
                  + (" (skipped)" if state == "done" else ""))
      todo += [] if state == "done" else [p]
    if f.pack <= 1:
      return ray_launcher.run(ray_launcher.point_units(todo), commands, resources,
                              f.ray_max_retries, console)
    from transformer.sweeps import packing  # pylint: disable=g-import-not-at-top  (imports JAX)
    packs, alone = packing.plan(f.config, todo, commands, f.pack, os.path.abspath(f.workdir))
    units = [ray_launcher.Unit(k.name, k.points) for k in packs] + ray_launcher.point_units(alone)
    return ray_launcher.run(units, commands, resources, f.ray_max_retries, console,
                            run_unit=packing.unit_runner(packs))


def report_flags() -> list[str]:
  """This sweep's flags (config, sweep, workdir, overrides), for titles and hints."""
  keep = ("--config", "--sweep", "--workdir", "--eval_split", "--metric")
  return [a for a in sys.argv[1:] if a.split("=", 1)[0].startswith(keep)]


if __name__ == "__main__":
  cli.run(main)
