r"""The ViT study on scikit-learn's digits (docs/vit.md): configs/vit.py's tiny and default
variants over seeds, an SVC on the same split, and the patch-size sweep; writes the record.

  python benchmarks/vit_digits.py --runs=runs/vit_digits --seeds=0,1,2 \
      --out=docs/results/vit_digits        # trains and evaluates what is missing, then reports
  python benchmarks/vit_digits.py --runs=runs/vit_digits --out=...   # only the report

Each variant V and seed K trains `python train.py --config=configs/vit.py:V --config.seed=K
--config.data.shuffle_seed=K` in RUNS/V_seedK, one process at a time, then `python eval.py
--split=test --step=best` (the checkpoint of the best validation accuracy). The sweep runs
`python sweep.py --config=configs/vit.py:tiny --sweep=configs/sweeps/vit_patch.py` in
RUNS/sweep_patch, and each of its points is evaluated again at --step=best (into
<point>/best). The SVC (RBF kernel on the pixels scaled to [0, 1]) picks C and gamma on the
validation split, is refit on train, and scores test once. A workdir that holds its metrics is
skipped (rerun to resume); --dry_run prints the commands. Run it under `nice` to share a machine.

Writes under --out: record.json (test accuracy per seed, mean, min-max spread, wall clock),
results.json (every run's test metrics and the SVC's grid) and table.md.
"""

import argparse
import itertools
import json
import os
import subprocess
import sys
import time

import numpy as np

from commands import cpu_hardware, git_commit  # benchmarks/ is the script's directory


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SVC_GRID = {"C": (1.0, 3.0, 10.0, 30.0), "gamma": ("scale", 0.01, 0.03, 0.1)}
SWEEP_DIR, SWEEP_FILE = "sweep_patch", "configs/sweeps/vit_patch.py"


def commands(runs: str, variant: str, seed: int) -> tuple[str, list[str], list[str]]:
  """(workdir, train argv, eval argv) of one variant and seed."""
  workdir = os.path.join(runs, f"{variant}_seed{seed}")
  train = [sys.executable, "train.py", f"--config=configs/vit.py:{variant}",
           f"--workdir={workdir}", f"--config.seed={seed}", f"--config.data.shuffle_seed={seed}"]
  evaluate = [sys.executable, "eval.py", f"--workdir={workdir}", "--split=test", "--step=best"]
  return workdir, train, evaluate


def sweep_command(runs: str) -> list[str]:
  return [sys.executable, "sweep.py", "--config=configs/vit.py:tiny", f"--sweep={SWEEP_FILE}",
          f"--workdir={os.path.join(runs, SWEEP_DIR)}", "--metric=test/accuracy"]


def _run(argv: list[str], log: str) -> float:
  """Runs argv in the repository (output appended to `log`); returns its wall seconds."""
  print("+", " ".join(argv), flush=True)
  started = time.time()
  with open(log, "a", encoding="utf-8") as f:
    subprocess.run(argv, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, check=True)
  return time.time() - started


def run_missing(runs: str, seeds: list[int], variants: list[str], sweep: bool,
                dry_run: bool) -> None:
  """Trains and evaluates each missing variant/seed, then the sweep (and its best checkpoints)."""
  os.makedirs(runs, exist_ok=True)
  walltimes = os.path.join(runs, "walltimes.jsonl")
  for variant, seed in itertools.product(variants, seeds):
    workdir, train, evaluate = commands(runs, variant, seed)
    if os.path.exists(os.path.join(workdir, "metrics.test.json")):
      continue
    if dry_run:
      print(" ".join(train), "&&", " ".join(evaluate))
      continue
    seconds = _run(train, os.path.join(runs, "train.log"))
    _run(evaluate, os.path.join(runs, "eval.log"))
    with open(walltimes, "a", encoding="utf-8") as f:
      f.write(json.dumps({"workdir": os.path.basename(workdir), "train_seconds": seconds}) + "\n")
  if not sweep:
    return
  if dry_run:
    print(" ".join(sweep_command(runs)))
    return
  _run(sweep_command(runs), os.path.join(runs, "sweep.log"))
  for point in _sweep_points(runs):
    if not os.path.exists(os.path.join(point, "best", "metrics.test.json")):
      _run([sys.executable, "eval.py", f"--workdir={point}", "--split=test", "--step=best",
            f"--out={os.path.join(point, 'best')}"], os.path.join(runs, "eval.log"))


def _sweep_points(runs: str) -> list[str]:
  root = os.path.join(runs, SWEEP_DIR)
  if not os.path.isdir(root):
    return []
  return sorted(os.path.join(root, d) for d in os.listdir(root)
                if os.path.exists(os.path.join(root, d, "config.json")))


def svc_baseline() -> dict:
  """scikit-learn's SVC on the pinned split: C, gamma chosen on validation, test scored once."""
  from sklearn import svm  # pylint: disable=g-import-not-at-top  (the baseline only)
  from transformer.data import images  # pylint: disable=g-import-not-at-top  (JAX-free, slow)
  data = images._digits()  # pylint: disable=protected-access
  flat = {s: (x.reshape(len(x), -1), y) for s, (x, y) in data.splits.items()}
  started = time.time()
  grid = []
  for c, gamma in itertools.product(SVC_GRID["C"], SVC_GRID["gamma"]):
    model = svm.SVC(C=c, gamma=gamma).fit(*flat["train"])
    grid.append({"C": c, "gamma": gamma, "validation_accuracy": model.score(*flat["validation"])})
  best = max(grid, key=lambda g: g["validation_accuracy"])  # the first of equals: grid order
  model = svm.SVC(C=best["C"], gamma=best["gamma"]).fit(*flat["train"])
  return {"grid": grid, "chosen": {"C": best["C"], "gamma": best["gamma"]},
          "validation_accuracy": best["validation_accuracy"],
          "test_accuracy": model.score(*flat["test"]), "wall_seconds": time.time() - started}


def _read(path: str) -> dict | None:
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _walltimes(runs: str) -> dict[str, float]:
  path = os.path.join(runs, "walltimes.jsonl")
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8") as f:
    return {r["workdir"]: r["train_seconds"] for r in map(json.loads, f)}


def collect(runs: str) -> dict[str, dict[int, dict]]:
  """{group: {seed: {'accuracy', 'f1', 'loss', 'train_seconds'}}} of the variants and the sweep's
  points (groups patch2, patch4), test metrics at the best validation checkpoint."""
  out: dict[str, dict[int, dict]] = {}
  walls = _walltimes(runs)
  for name in sorted(os.listdir(runs)) if os.path.isdir(runs) else []:
    variant, _, seed = name.rpartition("_seed")
    metrics = _read(os.path.join(runs, name, "metrics.test.json"))
    if variant and seed.isdigit() and metrics:
      out.setdefault(variant, {})[int(seed)] = _summary(metrics) | {
          "train_seconds": walls.get(name)}
  for point in _sweep_points(runs):
    cfg = _read(os.path.join(point, "config.json"))
    metrics = _read(os.path.join(point, "best", "metrics.test.json"))
    record = _read(os.path.join(point, "sweep_point.json")) or {}
    if cfg and metrics:
      group = f"patch{cfg['model']['patch_size']}"
      out.setdefault(group, {})[int(cfg["seed"])] = _summary(metrics) | {
          "train_seconds": record.get("train_seconds")}
  return out


def _summary(metrics: dict) -> dict:
  return {k: metrics[k] for k in ("accuracy", "f1", "loss", "step")}


def _stats(by_seed: dict[int, dict]) -> dict:
  acc = np.array([by_seed[s]["accuracy"] for s in sorted(by_seed)]) * 100
  walls = [by_seed[s]["train_seconds"] for s in sorted(by_seed)
           if by_seed[s]["train_seconds"] is not None]
  return {"seeds": sorted(by_seed), "test_accuracy": [round(float(a), 2) for a in acc],
          "mean": round(float(acc.mean()), 2), "min": round(float(acc.min()), 2),
          "max": round(float(acc.max()), 2),
          "std": round(float(acc.std(ddof=1)), 2) if len(acc) > 1 else 0.0,
          "mean_train_seconds": round(float(np.mean(walls)), 1) if walls else None}


NAMES = {"tiny": "ViT `:tiny` (d 64, 4 layers, 1,500 steps)",
         "default": "ViT default (d 64, 4 layers, 4x4 patches, 4,500 steps)",
         "patch2": "sweep: `:tiny`, 2x2 patches (16 tokens + class token)",
         "patch4": "sweep: `:tiny`, 4x4 patches (4 tokens + class token)"}


def table(stats: dict[str, dict], svc: dict) -> list[str]:
  lines = ["| model | test accuracy % (mean) | min-max | seeds | train s / run |",
           "|---|---|---|---|---|"]
  for group in [g for g in NAMES if g in stats]:
    s = stats[group]
    wall = f"{s['mean_train_seconds']:.0f}" if s["mean_train_seconds"] else "-"
    lines.append(f"| {NAMES[group]} | {s['mean']:.2f} | {s['min']:.2f}-{s['max']:.2f} | "
                 f"{len(s['seeds'])} | {wall} |")
  lines.append(f"| SVC, RBF (C={svc['chosen']['C']}, gamma={svc['chosen']['gamma']}, chosen on "
               f"validation) | {100 * svc['test_accuracy']:.2f} | - | deterministic | "
               f"{svc['wall_seconds']:.1f} (grid) |")
  return lines




def report(runs: str, out: str, variants: tuple[str, ...] = ("tiny", "default"),
           sweep: bool = True) -> dict:
  """Writes record.json, results.json and table.md under `out`; returns the record."""
  results = collect(runs)
  stats = {g: _stats(by_seed) for g, by_seed in results.items()}
  svc = svc_baseline()
  os.makedirs(out, exist_ok=True)
  lines = table(stats, svc)
  with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as f:
    json.dump({"runs": results, "stats": stats, "svc": svc}, f, indent=1, default=str)
  metrics = {f"test_accuracy_{g}": s["mean"] for g, s in stats.items()}
  metrics |= {f"test_accuracy_{g}_seed{seed}": acc for g, s in stats.items()
              for seed, acc in zip(s["seeds"], s["test_accuracy"])}
  metrics["test_accuracy_svc"] = round(100 * svc["test_accuracy"], 2)
  walls = [r["train_seconds"] for by_seed in results.values() for r in by_seed.values()
           if r["train_seconds"] is not None]
  record = {
      "name": "vit_digits",
      "title": (f"ViT on scikit-learn's 8x8 digits: configs/vit.py "
                f"{' and '.join(':' + v for v in variants if v in results)} over seeds, an SVC "
                f"on the same split" + (", a patch-size sweep" if "patch2" in results else "")),
      "task": "Image classification (scikit-learn digits, pinned stratified split "
              "1259/179/359)",
      "config": "configs/vit.py", "overrides": [],
      "command": (f"python benchmarks/vit_digits.py --runs={runs} --seeds=0,1,2 "
                  f"--variants={','.join(variants)}{'' if sweep else ' --nosweep'} --out={out}"),
      "commit": git_commit(),
      "hardware": cpu_hardware("shared"),
      "versions": None,
      "wall_clock_s": round(float(sum(walls)), 1) if walls else None,
      "rates": {}, "metrics": metrics,
      "seeds": sorted({s for by_seed in results.values() for s in by_seed}),
      "spread": {f"test_accuracy_{g}": [s["min"], s["max"]] for g, s in stats.items()},
      "report": "docs/vit.md#results",
  }
  with open(os.path.join(out, "record.json"), "w", encoding="utf-8") as f:
    json.dump(record, f, indent=1)
  print("\n".join(lines))
  return record


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--runs", required=True, help="directory of the runs")
  parser.add_argument("--out", default="docs/results/vit_digits", help="output directory")
  parser.add_argument("--seeds", default="", help="seeds to train and evaluate first (missing "
                      "runs only), comma-separated")
  parser.add_argument("--variants", default="tiny,default", help="configs/vit.py variants")
  parser.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=True,
                      help="run the patch-size sweep too (with --seeds)")
  parser.add_argument("--dry_run", action="store_true",
                      help="print the missing runs' commands, run nothing")
  args = parser.parse_args(argv)
  variants = [v for v in args.variants.split(",") if v]
  if args.seeds:
    run_missing(args.runs, [int(s) for s in args.seeds.split(",")], variants, args.sweep,
                args.dry_run)
  if not args.dry_run:
    report(args.runs, args.out, tuple(variants), args.sweep)


if __name__ == "__main__":
  main()
