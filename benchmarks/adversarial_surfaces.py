"""The adversarial campaign's cases beyond the checkpoint and training paths: readers of
metrics.jsonl, resume of a changed model or data file, inputs checked where
they enter, the one write guard. Each function stages its case in `ctx` (benchmarks/
adversarial.py's Context: `dir`, `run`, `config`) and returns the command's argv; `CASES` holds
their rows as data, read by adversarial.py."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import textwrap

PY = sys.executable
STRAY = b'\xff\xfe\x00 stray bytes\n{"step": 60, "train/loss": NaN, "eval/loss": Infinity}\n{"st'


def _train(ctx, *flags: str) -> list[str]:
  return [PY, "train.py", f"--config={ctx.config}", f"--workdir={ctx.run}", *flags]


def _spoil_metrics(ctx) -> None:
  with open(os.path.join(ctx.run, "metrics.jsonl"), "ab") as f:
    f.write(STRAY)


def compare_hostile_metrics(ctx):
  """compare on a run whose metrics.jsonl holds stray bytes, NaN, an infinity, a torn line."""
  _spoil_metrics(ctx)
  return [PY, "-m", "transformer.run.compare", ctx.run]


def _shows_nan_and_names_the_line(ctx, proc) -> bool:
  return "| nan |" in proc.stdout and "metrics.jsonl:" in proc.stderr


def resume_hostile_metrics(ctx):
  _spoil_metrics(ctx)
  return _train(ctx, "--config.train.num_steps=70")


def _resumed_readable(ctx, proc) -> bool:
  with open(os.path.join(ctx.run, "metrics.jsonl"), "rb") as f:
    rows = [json.loads(line) for line in f.read().decode("utf-8").splitlines()]
  return "done: step=70" in proc.stdout and max(r["step"] for r in rows) == 70


def resume_key(key: str, value: str):
  """A resume to step 70 with model.`key` changed (one that keeps the parameters' shapes)."""
  return lambda ctx: _train(ctx, "--config.train.num_steps=70", f"--config.{key}={value}")


def resume_edited_train_file(ctx):
  """The training file edited (a word added) between the run and its resume."""
  with open(os.path.join(ctx.run, "config.json")) as f:
    data = json.load(f)["data"]
  edited = os.path.join(ctx.dir, "train.tsv")
  shutil.copy(data["train_file"], edited)
  with open(edited, "a", encoding="utf-8") as f:
    f.write("zyzzyva\tZ IH1 Z IY0 V AH0\n")
  shutil.copytree(data["data_dir"], os.path.join(ctx.dir, "tfds"))
  return _train(ctx, "--config.train.num_steps=70", f"--config.data.train_file={edited}",
                f"--config.data.data_dir={ctx.dir}/tfds")


def _sweep(ctx, *flags: str) -> list[str]:
  path = os.path.join(ctx.dir, "lr_sweep.py")
  with open(path, "w") as f:
    f.write("from configs.sweeps import sweep\n\n\ndef get_sweep():\n"
            "  return sweep('train.learning_rate', [1e-3, 3e-3])\n")
  return [PY, "sweep.py", f"--config={ctx.config}", f"--sweep={path}", *flags]


def asha_unlogged_metric(ctx):
  return _sweep(ctx, f"--workdir={ctx.dir}/sweep", "--early_stop=asha", "--asha_metric=eval/wr")


def sweep_workdir_file(ctx):
  with open(os.path.join(ctx.dir, "results"), "w") as f:
    f.write("a user's file\n")
  return _sweep(ctx, f"--workdir={ctx.dir}/results")


def wandb_without_key(ctx):
  """train.wandb_project set, W&B online (its default) and no API key anywhere."""
  return ["env", "-u", "WANDB_API_KEY", "-u", "WANDB_MODE", f"NETRC={ctx.dir}/no_netrc",
          PY, "train.py", f"--config={ctx.config}", f"--workdir={ctx.dir}/new",
          "--config.train.num_steps=10", "--config.train.wandb_project=p"]


def _workdir_untouched(ctx, proc) -> bool:
  return not os.path.exists(os.path.join(ctx.dir, "new"))


def keep_best_by_unlogged(ctx):
  return [PY, "train.py", f"--config={ctx.config}", f"--workdir={ctx.dir}/new",
          "--config.train.num_steps=10", "--config.checkpoint.keep_best_by=eval/wr"]


def _pixels(images: str):
  """classify()'s input check on `images` (Python text; numpy as np) for the ViT config's run
  (8x8 pixels, one channel; documented: floats in [0, 1] or uint8)."""
  code = textwrap.dedent(f"""\
      import types
      import numpy as np
      from configs import vit
      from transformer.config import from_configdict
      from transformer.infer import api
      run = types.SimpleNamespace(config=from_configdict(vit.get_config()))
      api.Run.image_inputs(run, {images})
      """)
  return lambda ctx: [PY, "-c", "import sys\ntry:\n" + textwrap.indent(code, "  ") + (
      "except ValueError as e:\n  print(f'error: {e}', file=sys.stderr); sys.exit(1)\n")]


float_pixels_0_255 = _pixels("np.full((8, 8, 1), 255.0)")


def _compare(*args: str):
  return lambda ctx: [PY, "-m", "transformer.run.compare", *[a.format(ctx=ctx) for a in args]]


def compare_other_data(ctx):
  """The run and a copy of it whose config names another training file."""
  other = os.path.join(ctx.dir, "other")
  shutil.copytree(ctx.run, other, symlinks=True)
  with open(os.path.join(other, "config.json")) as f:
    config = json.load(f)
  config["data"]["train_file"] = os.path.join(ctx.dir, "other.tsv")
  with open(os.path.join(other, "config.json"), "w") as f:
    json.dump(config, f, indent=1)
  return [PY, "-m", "transformer.run.compare", ctx.run, other]


def _warns_other_data(ctx, proc) -> bool:
  return "different data: data.train_file" in proc.stdout + proc.stderr


def compare_garbage_evaluation(ctx):
  with open(os.path.join(ctx.run, "metrics.test.json"), "wb") as f:
    f.write(b"\xff\xfe[1, 2]")
  return [PY, "-m", "transformer.run.compare", ctx.run]


def _names_the_evaluation_file(ctx, proc) -> bool:
  return "metrics.test.json: not a JSON object" in proc.stderr and "| 60 |" in proc.stdout


def _predict_stdin(content: bytes):
  """predict reading `content` on its standard input."""
  def setup(ctx):
    path = os.path.join(ctx.dir, "inputs.txt")
    with open(path, "wb") as f:
      f.write(content)
    argv = [PY, "-m", "transformer.infer.predict", f"--workdir={ctx.run}"]
    return ["sh", "-c", f"{shlex.join(argv)} < {shlex.quote(path)}"]
  return setup


def eval_out_over_users_file(ctx):
  os.makedirs(os.path.join(ctx.dir, "mine"))
  with open(os.path.join(ctx.dir, "mine", "metrics.validation.json"), "w") as f:
    f.write("my own notes\n")
  return [PY, "eval.py", f"--workdir={ctx.run}", "--split=validation", f"--out={ctx.dir}/mine"]


def eval_out_inside_run(ctx):
  return [PY, "eval.py", f"--workdir={ctx.run}", "--split=validation",
          f"--out={ctx.run}/tokenizers"]


def train_inside_another_run(ctx):
  return [PY, "train.py", f"--config={ctx.config}", f"--workdir={ctx.run}/checkpoints/ft",
          "--config.train.num_steps=10"]


def compare_plot_into_run(ctx):
  return [PY, "-m", "transformer.run.compare", ctx.run, f"--plot={ctx.run}/curves.png"]


def compare_plot_over_users_file(ctx):
  with open(os.path.join(ctx.dir, "curves.png"), "wb") as f:
    f.write(b"a user's picture")
  return [PY, "-m", "transformer.run.compare", ctx.run, f"--plot={ctx.dir}/curves.png"]


def init_from_corrupt_step(ctx):
  """--init_from a run whose newest step fails verification (train.py has no --step)."""
  state = os.path.join(ctx.run, "checkpoints", "60", "state")
  paths = [os.path.join(d, n) for d, _, names in os.walk(state) for n in names]
  path = max(paths, key=os.path.getsize)
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, 1)
    f.write(bytes([byte[0] ^ 1]))
  return [PY, "train.py", f"--config={ctx.config}", f"--workdir={ctx.dir}/ft",
          f"--init_from={ctx.run}", "--config.train.num_steps=10"]


def _advice_without_step_flag(ctx, proc) -> bool:
  last = proc.stderr.strip().splitlines()[-1]
  return "--step" not in last and ".corrupt" in last


METRICS_RESUME = ("run/provenance.json", "run/train_done.json", "run/config.json",
                  "run/metrics.jsonl", "run/checkpoints/70")
# (name, goal, expected, setup, culprit, check, may_change) of each case.
CASES = [
    ("compare, metrics.jsonl with stray bytes and NaN", "readers", "ok", compare_hostile_metrics,
     "", _shows_nan_and_names_the_line, ()),
    ("resume, metrics.jsonl with stray bytes and NaN", "readers", "ok", resume_hostile_metrics,
     "", _resumed_readable, METRICS_RESUME),
    ("resume with another attention window", "resume meaning", "clear error",
     resume_key("model.sliding_window", "4"), "model.sliding_window", None, ()),
    ("resume with other MoE routing (top_k)", "resume meaning", "clear error",
     resume_key("model.moe_top_k", "1"), "model.moe_top_k", None, ()),
    ("resume after the training file was edited", "resume meaning", "clear error",
     resume_edited_train_file, "data.train_file", None, ("tfds",)),
    ("ASHA metric the task never logs", "inputs", "clear error", asha_unlogged_metric,
     "--asha_metric='eval/wr'", None, ()),
    ("sweep --workdir that is a file", "inputs", "clear error", sweep_workdir_file,
     "is a file", None, ()),
    ("W&B online without an API key", "inputs", "clear error", wandb_without_key,
     "train.wandb_project", _workdir_untouched, ()),
    ("checkpoint.keep_best_by never logged", "inputs", "clear error", keep_best_by_unlogged,
     "checkpoint.keep_best_by='eval/wr'", None, ()),
    ("classify, float pixels in [0, 255]", "inputs", "clear error", float_pixels_0_255,
     "pixels of float64", None, ()),
    ("--init_from a run whose newest step fails verification", "clear messages", "clear error",
     init_from_corrupt_step, "--init_from", _advice_without_step_flag, ()),
    ("eval --out over a user's file", "nothing lost", "clear error", eval_out_over_users_file,
     "metrics.validation.json", None, ()),
    ("eval --out inside the run's workdir", "nothing lost", "clear error", eval_out_inside_run,
     "inside the run", None, ()),
    ("train --workdir inside another run", "nothing lost", "clear error",
     train_inside_another_run, "inside the run", None, ()),
    ("compare --plot into a run's workdir", "nothing lost", "clear error", compare_plot_into_run,
     "--plot", None, ()),
    ("compare --plot over a user's file", "nothing lost", "clear error",
     compare_plot_over_users_file, "curves.png", None, ()),
    ("classify, NaN pixels", "inputs", "clear error", _pixels("np.full((8, 8, 1), np.nan)"),
     "NaN", None, ()),
    ("classify, an RGB image for a grayscale run", "inputs", "clear error",
     _pixels("np.zeros((8, 8, 3), np.uint8)"), "(8, 8, 3)", None, ()),
    ("classify, images of different shapes", "inputs", "clear error",
     _pixels("[np.zeros((8, 8, 1)), np.zeros((9, 8, 1))]"), "images of different shapes", None,
     ()),
    ("compare, no runs", "inputs", "clear error", _compare(), "no workdirs given", None, ()),
    ("compare, a glob matching nothing", "inputs", "clear error", _compare("{ctx.dir}/nothing*"),
     "matches no workdir", None, ()),
    ("compare, a file", "inputs", "clear error", _compare("{ctx.run}/metrics.jsonl"),
     "metrics.jsonl is a file", None, ()),
    ("compare, runs on different data", "readers", "ok", compare_other_data, "",
     _warns_other_data, ()),
    ("compare, metrics.test.json of stray bytes", "readers", "ok", compare_garbage_evaluation,
     "", _names_the_evaluation_file, ()),
    ("predict, empty standard input", "inputs", "clear error", _predict_stdin(b""), "no input",
     None, ()),
    ("predict, a 5-million-character line", "inputs", "clear error",
     _predict_stdin(b"a" * 5_000_000 + b"\n"), "too long", None, ()),
    ("predict, blank lines", "inputs", "clear error", _predict_stdin(b"\n  \n\t\n"), "is empty",
     None, ()),
]
