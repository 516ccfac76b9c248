"""The adversarial campaign's cases on sweeps: the sweep's own files and the runs in its points'
directories, its settings (search spaces, ASHA, packing, Ray's address) checked before anything
runs, W&B's mode and credentials, the report and console on hostile metrics.jsonl. Each function
stages its case in `ctx` (benchmarks/adversarial.py's Context: `dir`, `run`, `config`) and returns
the command's argv; `CASES` holds their rows as data, read by adversarial.py."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap

PY = sys.executable
# A metrics.jsonl tail: stray bytes, NaN and an infinity, times that are not finite, a torn line.
HOSTILE = (b'\xff\xfe\x00 stray bytes\n{"step": 60, "train/loss": NaN, "eval/loss": Infinity}\n'
           b'{"step": 61, "train/loss": NaN, "time/elapsed_s": NaN}\n'
           b'{"step": 62, "train/loss": Infinity, "time/elapsed_s": Infinity}\n{"st')


def _run_lr(ctx) -> float:
  with open(os.path.join(ctx.run, "config.json")) as f:
    return json.load(f)["train"]["learning_rate"]


def _sweep_file(ctx, body: str) -> str:
  path = os.path.join(ctx.dir, "sweep_file.py")
  with open(path, "w") as f:
    f.write("from configs.sweeps import choice, log_uniform, random_search, sweep, uniform\n\n\n"
            f"def get_sweep():\n  return {body}\n")
  return path


def _sweep(ctx, body: str, *flags: str, steps: int = 10) -> list[str]:
  """sweep.py over the run's config, `steps` a point, in ctx.dir/sweep unless flags say."""
  workdir = [] if any(f.startswith("--workdir=") for f in flags) else [f"--workdir={ctx.dir}/sweep"]
  return [PY, "sweep.py", f"--config={ctx.config}", f"--sweep={_sweep_file(ctx, body)}",
          *workdir, f"--config.train.num_steps={steps}", "--eval_split=", *flags]


LR_SWEEP = "sweep('train.learning_rate', [1e-3, 3e-3])"


def _no_sweep_dir(ctx, proc) -> bool:
  return not os.path.exists(os.path.join(ctx.dir, "sweep"))


def _spoil(workdir: str) -> None:
  with open(os.path.join(workdir, "metrics.jsonl"), "ab") as f:
    f.write(HOSTILE)


def report_over_users_results(ctx):
  os.makedirs(os.path.join(ctx.dir, "sweep"))
  with open(os.path.join(ctx.dir, "sweep", "results.md"), "w") as f:
    f.write("my notes on this sweep\n")
  return _sweep(ctx, LR_SWEEP)


def sweep_inside_run(ctx):
  return _sweep(ctx, LR_SWEEP, f"--workdir={ctx.run}/sweeps")


def report_hostile_metrics(ctx):
  """--report_only over a point (the run, copied where the sweep puts it) whose metrics.jsonl
  holds stray bytes, NaN, infinities and a torn line."""
  point = os.path.join(ctx.dir, "sweep", f"lr={_run_lr(ctx)!r}")
  shutil.copytree(ctx.run, point, symlinks=True)
  _spoil(point)
  return _sweep(ctx, f"sweep('train.learning_rate', [{_run_lr(ctx)!r}])", "--report_only",
                steps=60)


def _report_shows_nan(ctx, proc) -> bool:
  with open(os.path.join(ctx.dir, "sweep", "results.md")) as f:
    md = f.read()
  return ("| nan |" in md or "| inf |" in md) and "metrics.jsonl:" in proc.stderr


def console_hostile_metrics(ctx):
  """The sweep console's status line of a running point whose log holds NaN and infinite
  losses and times."""
  _spoil(ctx.run)
  code = textwrap.dedent(f"""\
      from transformer.sweeps import spec, watch
      console = watch.Console(every=0)
      console.running(spec.Point(0, {{}}, "p", {ctx.run!r}, 100), "train")
      print(console.lines()[0][1])
      """)
  return [PY, "-c", "import sys\ntry:\n" + textwrap.indent(code, "  ") +
          "except ValueError as e:\n  print(f'error: {e}', file=sys.stderr); sys.exit(1)\n"]


def _console_shows_nan(ctx, proc) -> bool:
  return "p: step 62/100  loss inf" in proc.stdout and "metrics.jsonl:" in proc.stderr


def _wandb(*flags: str) -> list[str]:
  return ["env", "-u", "WANDB_API_KEY", "-u", "WANDB_MODE", *flags]


def sweep_wandb_without_key(ctx):
  return _wandb(f"NETRC={ctx.dir}/no_netrc", *_sweep(ctx, LR_SWEEP,
                                                     "--config.train.wandb_project=p"))


def asha_max_of_a_loss(ctx):
  return _sweep(ctx, LR_SWEEP, "--early_stop=asha", "--asha_metric=eval/loss", "--asha_mode=max")


def _point_of_another_run(ctx, *flags: str) -> list[str]:
  """A copy of the run (its own learning rate, its 60 steps) where the sweep puts point
  lr=0.001."""
  shutil.copytree(ctx.run, os.path.join(ctx.dir, "sweep", "lr=0.001"), symlinks=True)
  return _sweep(ctx, LR_SWEEP, *flags, steps=60)


def point_dir_holds_another_run(ctx):
  return _point_of_another_run(ctx)


def pack_member_holds_another_run(ctx):
  return _point_of_another_run(ctx, "--pack=2")


def _flag_case(body: str, *flags: str):
  return lambda ctx: _sweep(ctx, body, *flags)


def wandb_offline(ctx):
  """W&B offline, no API key anywhere: a 10-step run logs locally (in the workdir)."""
  return _wandb(f"NETRC={ctx.dir}/no_netrc", PY, "train.py", f"--config={ctx.config}",
                f"--workdir={ctx.dir}/new", "--config.train.num_steps=10",
                "--config.train.wandb_project=p", "--config.train.wandb_mode=offline")


def _logged_offline(ctx, proc) -> bool:
  return ("done: step=10" in proc.stdout
          and os.path.isdir(os.path.join(ctx.dir, "new", "wandb")))


def wandb_mode_not_a_mode(ctx):
  return ["env", "WANDB_MODE=sometimes", PY, "train.py", f"--config={ctx.config}",
          f"--workdir={ctx.dir}/new", "--config.train.num_steps=10",
          "--config.train.wandb_project=p"]


def _no_new_workdir(ctx, proc) -> bool:
  return not os.path.exists(os.path.join(ctx.dir, "new"))


def wandb_project_with_a_slash(ctx):
  """A W&B project name W&B refuses (wandb.init would raise after the workdir was written)."""
  return [PY, "train.py", f"--config={ctx.config}", f"--workdir={ctx.dir}/new",
          "--config.train.num_steps=10", "--config.train.wandb_project=team/p",
          "--config.train.wandb_mode=offline"]


def sweep_file_of_binary(ctx):
  """A sweep file of random bytes (null bytes among them), named as no Python file is."""
  path = os.path.join(ctx.dir, "points.sweep")
  with open(path, "wb") as f:
    f.write(bytes(range(256)) * 4)
  return [PY, "sweep.py", f"--config={ctx.config}", f"--sweep={path}", f"--workdir={ctx.dir}/sweep"]


# (name, goal, expected, setup, culprit, check, may_change) of each case.
CASES = [
    ("sweep over a results.md a user wrote", "nothing lost", "clear error",
     report_over_users_results, "results.md", None, ()),
    ("sweep --workdir inside a run", "nothing lost", "clear error", sweep_inside_run,
     "inside the run", None, ()),
    ("sweep report, metrics.jsonl with stray bytes, NaN and infinities", "readers", "ok",
     report_hostile_metrics, "", _report_shows_nan, ()),
    ("sweep console, metrics.jsonl with NaN and infinite times", "readers", "ok",
     console_hostile_metrics, "", _console_shows_nan, ()),
    ("sweep with W&B online without an API key", "inputs", "clear error",
     sweep_wandb_without_key, "train.wandb_project", _no_sweep_dir, ()),
    ("ASHA maximizing a loss", "inputs", "clear error", asha_max_of_a_loss, "--asha_mode=max",
     _no_sweep_dir, ()),
    ("sweep point directory holding a run no sweep started", "silent results", "clear error",
     point_dir_holds_another_run, "train.learning_rate=0.005", None, ()),
    ("sweep --pack, a member directory holding a run no sweep started", "silent results",
     "clear error", pack_member_holds_another_run, "train.learning_rate=0.005", None, ()),
    ("sweep value of the wrong type", "inputs", "clear error",
     _flag_case("sweep('model.d_model', ['big'])"), "model.d_model='big' is of type str",
     _no_sweep_dir, ()),
    ("sweep file of binary bytes, not named .py", "inputs", "clear error", sweep_file_of_binary,
     "points.sweep", _no_sweep_dir, ()),
    ("random search, log_uniform from 0", "inputs", "clear error",
     _flag_case("random_search({'train.learning_rate': log_uniform(0, 1e-3)}, num_points=2)"),
     "log_uniform(0, 0.001)", _no_sweep_dir, ()),
    ("random search, empty space", "inputs", "clear error",
     _flag_case("random_search({}, num_points=2)"), "non-empty dict", _no_sweep_dir, ()),
    ("random search, floats for an integer key", "inputs", "clear error",
     _flag_case("random_search({'train.warmup_steps': uniform(0, 100)}, num_points=2)"),
     "train.warmup_steps", _no_sweep_dir, ()),
    ("--ray_address that is not HOST:PORT", "inputs", "clear error",
     _flag_case(LR_SWEEP, "--launcher=ray", "--ray_address=nonsense"), "--ray_address=nonsense",
     _no_sweep_dir, ()),
    ("--ray_address where nothing listens", "inputs", "clear error",
     _flag_case(LR_SWEEP, "--launcher=ray", "--ray_address=127.0.0.1:1"),
     "no Ray cluster answers", _no_sweep_dir, ()),
    ("sweep --workdir=''", "nothing lost", "clear error", _flag_case(LR_SWEEP, "--workdir="),
     "--workdir=''", None, ()),
    ("sweep --python that does not exist", "inputs", "clear error",
     _flag_case(LR_SWEEP, "--python=/nonexistent/python"), "--python=/nonexistent/python",
     _no_sweep_dir, ()),
    ("sweep --parallel=0", "inputs", "clear error", _flag_case(LR_SWEEP, "--parallel=0"),
     "--parallel=0", _no_sweep_dir, ()),
    ("sweep --ray_num_gpus=nan", "inputs", "clear error",
     _flag_case(LR_SWEEP, "--launcher=ray", "--ray_num_gpus=nan"), "--ray_num_gpus=nan",
     _no_sweep_dir, ()),
    ("sweep --metric that no report row can hold", "inputs", "clear error",
     _flag_case(LR_SWEEP, "--metric=eval/wer"), "--metric=eval/wer", _no_sweep_dir, ()),
    ("W&B offline without an API key", "inputs", "ok", wandb_offline, "", _logged_offline, ()),
    ("W&B project name with a slash", "inputs", "clear error", wandb_project_with_a_slash,
     "train.wandb_project='team/p'", _no_new_workdir, ()),
    ("WANDB_MODE that is not a mode", "inputs", "clear error", wandb_mode_not_a_mode,
     "WANDB_MODE='sometimes'", _no_new_workdir, ()),
]
