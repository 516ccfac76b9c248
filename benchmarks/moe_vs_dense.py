r"""A mixture of experts against the dense model with the same active parameters, on the character
LM: configs/lm.py:moe (8 GELU experts of hidden 256, top-2) and configs/lm.py:moe_dense (GELU,
hidden 512), the same steps, 3 seeds each; the validation loss per seed and the step time of
each, as a same-run ratio.

  python benchmarks/moe_vs_dense.py --out=/tmp/moe_vs_dense \
      --text_file=/path/to/tinyshakespeare.txt   # writes docs/results/moe_vs_dense/record.json
  python benchmarks/moe_vs_dense.py --out=/tmp/moe_smoke --smoke \
      --text_file=/path/to/tinyshakespeare.txt   # a check that it runs: 1 seed, 4 steps, the
                                                 # record in --out only
  (--config.* flags pass on to every train.py command)

Each run is one `python train.py` process on the text file (the first 90% train, the last 10%
validation, nanoGPT's split). The seeds go in turn and, within a seed, the dense run and then the
mixture's, so that a drift of the machine's speed reaches both alike; the step-time ratio is each
seed's mixture over its dense run, then averaged. The step time is 1 / the median of the run's
logged perf/steps_per_sec (compilation and evaluations left out). The validation loss is the
final evaluation's eval/loss (eval.num_batches batches of the validation split, as configured).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import commands  # benchmarks/ is the script's directory
from transformer.run import metrics_log

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(REPO, "docs", "results", "moe_vs_dense", "record.json")
MODELS = (("dense", "configs/lm.py:moe_dense"), ("moe", "configs/lm.py:moe"))
SMOKE = ["--config.train.num_steps=4", "--config.train.log_every_steps=2",
         "--config.eval.every_steps=4", "--config.eval.num_batches=2",
         "--config.checkpoint.every_steps=4"]


def train(config: str, workdir: str, seed: int, extra: list[str]) -> dict:
  """Runs train.py once; returns its final eval/loss, median step time and last logged metrics."""
  cmd = [sys.executable, "train.py", f"--config={config}", f"--workdir={workdir}",
         f"--config.seed={seed}", *extra]
  start = time.time()
  proc = commands.run(cmd, cwd=REPO)
  if proc.returncode:
    raise SystemExit(f"moe_vs_dense: `train.py --workdir={workdir}` {commands.failure(proc)}")
  rows = metrics_log.read(workdir)
  rates = [r["perf/steps_per_sec"] for r in rows if "perf/steps_per_sec" in r]
  evals = [r["eval/loss"] for r in rows if "eval/loss" in r]
  dropped = [r["train/moe_dropped"] for r in rows if "train/moe_dropped" in r]
  if not rates or not evals:
    raise SystemExit(f"moe_vs_dense: {workdir}/metrics.jsonl has no perf/steps_per_sec or "
                     "eval/loss")
  return {"dev_loss": evals[-1], "ms_per_step": 1000.0 / statistics.median(rates),
          "dropped": dropped[-1] if dropped else None, "wall_clock_s": time.time() - start}


def summarise(runs: dict[str, list[dict]], seeds: list[int]) -> tuple[dict, dict]:
  """(metrics, spread) of the runs: each model's mean validation loss and step time, each seed's
  values, and the mixture / dense step-time ratio of each seed, averaged."""
  metrics, spread = {}, {}
  for name, _ in MODELS:
    losses = [r["dev_loss"] for r in runs[name]]
    metrics[f"{name}_dev_loss"] = round(statistics.mean(losses), 4)
    spread[f"{name}_dev_loss"] = [round(min(losses), 4), round(max(losses), 4)]
    metrics[f"{name}_ms_per_step"] = round(statistics.mean(r["ms_per_step"] for r in runs[name]), 2)
    for seed, r in zip(seeds, runs[name]):
      metrics[f"{name}_dev_loss_seed{seed}"] = round(r["dev_loss"], 4)
  ratios = [m["ms_per_step"] / d["ms_per_step"] for m, d in zip(runs["moe"], runs["dense"])]
  metrics["step_time_ratio"] = round(statistics.mean(ratios), 3)
  spread["step_time_ratio"] = [round(min(ratios), 3), round(max(ratios), 3)]
  metrics["dev_loss_difference"] = round(metrics["moe_dev_loss"] - metrics["dense_dev_loss"], 4)
  dropped = [r["dropped"] for r in runs["moe"] if r["dropped"] is not None]
  if dropped:
    metrics["moe_dropped_fraction"] = round(statistics.mean(dropped), 4)
  return metrics, spread




def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="a fresh directory for the workdirs")
  parser.add_argument("--text_file", required=True, help="tiny Shakespeare as one text file")
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--smoke", action="store_true", help="1 seed, 4 steps; record in --out")
  args, extra = parser.parse_known_args()
  commands.check_study_args(parser, extra, args.text_file, args.out)
  seeds = list(range(1 if args.smoke else args.seeds))
  overrides = ["--config.data.dataset=text_files",
               f"--config.data.text_file={os.path.abspath(args.text_file)}",
               *(SMOKE if args.smoke else []), *extra]
  started = time.time()
  runs: dict[str, list[dict]] = {name: [] for name, _ in MODELS}
  for seed in seeds:
    for name, config in MODELS:
      r = train(config, os.path.join(args.out, f"{name}_seed{seed}"), seed, overrides)
      runs[name].append(r)
      print(f"seed {seed} {name}: eval/loss {r['dev_loss']:.4f}, {r['ms_per_step']:.1f} ms/step",
            flush=True)
  metrics, spread = summarise(runs, seeds)
  import jax  # pylint: disable=g-import-not-at-top  (only to name the versions)
  record = {
      "name": "moe_vs_dense",
      "title": "8 experts top-2 against the dense model with the same active FFN, character LM, "
               f"{len(seeds)} seeds, same run",
      "task": "Character LM (tiny Shakespeare)", "config": "configs/lm.py:moe vs :moe_dense",
      "overrides": overrides,
      "command": commands.command_line("moe_vs_dense.py", sys.argv[1:]),
      "commit": commands.git_commit(), "hardware": commands.cpu_hardware(),
      "versions": {"jax": jax.__version__}, "wall_clock_s": round(time.time() - started, 1),
      "rates": {"steps_per_s": round(1000.0 / metrics["moe_ms_per_step"], 3)},
      "metrics": metrics, "seeds": seeds, "report": "docs/moe.md#results", "spread": spread}
  path = commands.write_record(args.out if args.smoke else os.path.dirname(RECORD), record)
  print(json.dumps(metrics))
  print(f"wrote {os.path.relpath(path)}")


if __name__ == "__main__":
  main()
