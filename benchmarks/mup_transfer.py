r"""Learning-rate transfer across widths on the character LM, standard parametrization against µP
(docs/mup.md): for each parametrization and each width of the ladder, one `python train.py`
process trains every (learning rate, seed) pair of a factor-of-2 grid as one members program
(train.members), and the final validation loss of each member is read back.

  flock /tmp/heavy.lock python benchmarks/mup_transfer.py --out=/tmp/mup_transfer \
      --text_file=/path/to/tinyshakespeare.txt    # docs/results/mup_transfer/record.json + .png
  python benchmarks/mup_transfer.py --out=/tmp/mup_smoke --smoke \
      --text_file=/path/to/tinyshakespeare.txt    # 2 widths, 3 rates, 4 steps; --out only
  (--config.* flags pass on to every train.py command)

The model is configs/lm.py:nanogpt_cpu with --layers blocks, 4 heads (head_dim grows with the
width), mlp_dim = 4 d_model; µP's base width is the ladder's first. A width's best rate is the
grid's lowest seed-mean validation loss. What the record states: each parametrization's best rate
per width, how many grid steps it moves across the ladder, each wider width's loss at the
narrowest width's best rate relative to its own best, and µP's validation loss against width at
the transferred rate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import commands  # benchmarks/ is the script's directory
from transformer.run import metrics_log

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "docs", "results", "mup_transfer")
PARAMETRIZATIONS = ("standard", "mup")
SMOKE = ["--config.train.num_steps=4", "--config.eval.num_batches=2"]


def members_spec(rates: list[float], seeds: list[int]) -> str:
  """train.members for every (rate, seed) pair."""
  return ";".join(f"seed={s},train.learning_rate={lr!r}" for lr in rates for s in seeds)


def model_flags(parametrization: str, width: int, base: int, layers: int) -> list[str]:
  """The --config flags of one width of the ladder."""
  return [f"--config.model.parametrization={parametrization}",
          f"--config.model.mup_base_width={base if parametrization == 'mup' else 0}",
          f"--config.model.d_model={width}", f"--config.model.mlp_dim={4 * width}",
          "--config.model.num_heads=4", f"--config.model.num_decoder_layers={layers}"]


def train_width(workdir: str, flags: list[str], rates: list[float], seeds: list[int],
                reuse: str = "") -> dict:
  """Runs one members program (or reads the one of the same name under `reuse`, run by the same
  command); {rate: [final eval/loss per seed]} and its wall clock (None when reused)."""
  start = time.time()
  if reuse and os.path.isdir(os.path.join(reuse, os.path.basename(workdir))):
    workdir = os.path.join(reuse, os.path.basename(workdir))
  else:
    cmd = [sys.executable, "train.py", "--config=configs/lm.py:nanogpt_cpu",
           f"--workdir={workdir}", f"--config.train.members={members_spec(rates, seeds)}", *flags]
    proc = commands.run(cmd, cwd=REPO)
    if proc.returncode:
      raise SystemExit(f"mup_transfer: `train.py --workdir={workdir}` {commands.failure(proc)}")
    reuse = ""
  losses: dict[float, list[float]] = {}
  for lr in rates:
    for s in seeds:
      name = f"seed={s},train.learning_rate={lr:g}"
      rows = metrics_log.read(os.path.join(workdir, name, "metrics.jsonl"))
      evals = [r["eval/loss"] for r in rows if "eval/loss" in r]
      if not evals:
        raise SystemExit(f"mup_transfer: {workdir}/{name}/metrics.jsonl has no eval/loss")
      losses.setdefault(lr, []).append(evals[-1])
  return {"losses": losses, "wall_clock_s": None if reuse else time.time() - start}


def analyse(curves: dict[int, dict[float, list[float]]], rates: list[float]) -> dict:
  """One parametrization's best rate per width, its movement in grid steps, and each width's
  loss at the narrowest width's best rate over its own best, minus 1."""
  widths = sorted(curves)
  mean = {w: {lr: statistics.mean(v) for lr, v in curves[w].items()} for w in widths}
  best = {w: min(rates, key=lambda lr: mean[w][lr]) for w in widths}
  steps = [rates.index(best[w]) for w in widths]
  transferred = best[widths[0]]
  penalty = {w: mean[w][transferred] / mean[w][best[w]] - 1.0 for w in widths}
  return {"best_rate": {str(w): best[w] for w in widths},
          "best_rate_moves_grid_steps": max(steps) - min(steps),
          "loss_at_transferred_rate": {str(w): round(mean[w][transferred], 4) for w in widths},
          "best_loss": {str(w): round(mean[w][best[w]], 4) for w in widths},
          "transfer_penalty": {str(w): round(penalty[w], 4) for w in widths},
          "max_transfer_penalty": round(max(penalty.values()), 4),
          "wider_is_better_at_transferred_rate": all(
              mean[b][transferred] < mean[a][transferred] for a, b in zip(widths, widths[1:]))}


def flat_metrics(analysis: dict[str, dict], widths: list[int]) -> dict[str, float]:
  """The record's numbers: per parametrization the best rate's movement in grid steps, the
  largest transfer penalty, each width's best rate and its loss at the transferred rate."""
  out: dict[str, float] = {}
  for p, a in analysis.items():
    out[f"{p}_best_rate_moves_grid_steps"] = a["best_rate_moves_grid_steps"]
    out[f"{p}_max_transfer_penalty"] = a["max_transfer_penalty"]
    out[f"{p}_wider_is_better_at_transferred_rate"] = int(a["wider_is_better_at_transferred_rate"])
    for w in widths:
      out[f"{p}_best_rate_d{w}"] = a["best_rate"][str(w)]
      out[f"{p}_loss_at_transferred_rate_d{w}"] = a["loss_at_transferred_rate"][str(w)]
  return out


def seed_spread(curves: dict, analysis: dict) -> dict[str, list[float]]:
  """[lowest, highest] seed of each loss at the transferred rate."""
  out = {}
  for p, by_width in curves.items():
    rate = analysis[p]["best_rate"][str(min(by_width))]
    for w, losses in by_width.items():
      out[f"{p}_loss_at_transferred_rate_d{w}"] = [round(min(losses[rate]), 4),
                                                   round(max(losses[rate]), 4)]
  return out


def plot(curves: dict[str, dict[int, dict[float, list[float]]]], path: str) -> None:
  """Validation loss against learning rate, one line per width, one panel per parametrization."""
  from transformer.infer.viz import plt  # pylint: disable=g-import-not-at-top  (Agg; plots only)
  fig, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 4), sharey=True)
  for ax, (name, by_width) in zip(axes, curves.items()):
    for w in sorted(by_width):
      rates = sorted(by_width[w])
      ax.plot(rates, [statistics.mean(by_width[w][lr]) for lr in rates], marker="o",
              label=f"d_model {w}")
    ax.set(xscale="log", xlabel="learning rate", title=name)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("validation loss (nats/char)")
  axes[-1].legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def _arguments() -> tuple[argparse.Namespace, list[str]]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="a fresh directory for the workdirs")
  parser.add_argument("--text_file", required=True, help="tiny Shakespeare as one text file")
  parser.add_argument("--widths", default="32,64,128,256,512")
  parser.add_argument("--rates", default="2**-12..2**-5", help="log2 range of the grid")
  parser.add_argument("--seeds", type=int, default=2)
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--smoke", action="store_true", help="2 widths, 3 rates, 4 steps")
  parser.add_argument("--reuse", default="", help="an earlier --out of the same settings: its "
                      "finished programs (<parametrization>_d<width>) are read, not rerun")
  args, extra = parser.parse_known_args()
  commands.check_study_args(parser, extra, args.text_file, args.out)
  return args, extra


def _grid(text: str) -> list[float]:
  """'2**-12..2**-5' -> [2**-12, 2**-11, ..., 2**-5]."""
  low, high = (int(part.strip().removeprefix("2**")) for part in text.split(".."))
  return [2.0**k for k in range(low, high + 1)]


def main() -> None:
  args, extra = _arguments()
  widths = [int(w) for w in args.widths.split(",")]
  rates, seeds = _grid(args.rates), list(range(args.seeds))
  if args.smoke:
    widths, rates, seeds = widths[:2], rates[:3], [0]
  overrides = ["--config.data.dataset=text_files",
               f"--config.data.text_file={os.path.abspath(args.text_file)}",
               *(SMOKE if args.smoke else []), *extra]
  started = time.time()
  curves: dict[str, dict[int, dict[float, list[float]]]] = {p: {} for p in PARAMETRIZATIONS}
  walls = {}
  for p in PARAMETRIZATIONS:
    for w in widths:
      flags = model_flags(p, w, widths[0], args.layers) + overrides
      r = train_width(os.path.join(args.out, f"{p}_d{w}"), flags, rates, seeds, args.reuse)
      wall = r["wall_clock_s"]
      curves[p][w], walls[f"{p}_d{w}"] = r["losses"], wall and round(wall, 1)
      best = min(rates, key=lambda lr: statistics.mean(r["losses"][lr]))
      print(f"{p} d_model {w}: best rate {best:g}, "
            f"{'reused' if wall is None else f'{wall:.0f} s'}", flush=True)
  write_record(args, overrides, curves, rates, seeds, widths, walls, started)


def write_record(args, overrides, curves, rates, seeds, widths, walls, started) -> None:
  """Writes record.json, losses.json (the raw outputs) and the plot to docs/results/mup_transfer,
  or --out for a smoke run."""
  analysis = {p: analyse(curves[p], rates) for p in PARAMETRIZATIONS}
  metrics = flat_metrics(analysis, widths)
  raw = {p: {str(w): {f"{lr:g}": [round(x, 4) for x in v] for lr, v in by_w.items()}
             for w, by_w in curves[p].items()} for p in PARAMETRIZATIONS}
  import jax  # pylint: disable=g-import-not-at-top  (only to name the versions)
  record = {
      "name": "mup_transfer",
      "title": f"learning-rate transfer over d_model {widths[0]}..{widths[-1]}, standard vs µP, "
               f"{len(rates)} rates x {len(seeds)} seeds per width as one members program",
      "task": "Character LM (tiny Shakespeare)", "config": "configs/lm.py:nanogpt_cpu",
      "overrides": overrides + [f"--layers={args.layers}", f"--widths={args.widths}",
                                f"--rates={args.rates}", "--config.model.mlp_dim=4*d_model",
                                "--config.model.num_heads=4",
                                f"--config.model.mup_base_width={widths[0]}"],
      "command": "python benchmarks/mup_transfer.py " + " ".join(sys.argv[1:]),
      "commit": commands.git_commit(), "hardware": f"{os.cpu_count()}-core {platform.machine()} CPU",
      "versions": {"jax": jax.__version__}, "wall_clock_s": round(time.time() - started, 1),
      "rates": {}, "metrics": metrics,
      "seeds": seeds, "report": "docs/mup.md#learning-rate-transfer",
      "spread": seed_spread(curves, analysis)}
  out = args.out if args.smoke else RESULTS
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "record.json"), "w") as f:
    json.dump(record, f, indent=1)
  with open(os.path.join(out, "losses.json"), "w") as f:  # the raw outputs
    json.dump({"widths": widths, "learning_rates": rates, "analysis": analysis,
               "validation_loss_per_seed": raw, "wall_clock_s_per_program": walls}, f, indent=1)
  plot(curves, os.path.join(out, "transfer.png"))
  print(json.dumps(analysis))
  print(f"wrote {os.path.relpath(os.path.join(out, 'record.json'))}")


if __name__ == "__main__":
  main()
