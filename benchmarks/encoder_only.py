r"""The encoder-only campaign (docs/encoder_only.md): runs what is missing, then the table and plot
over seeds.

  python benchmarks/encoder_only.py --runs=RUNS_DIR --seeds=0,1,2 --data_dir=DATA_DIR \
      --out=docs/results/encoder_only          # trains and evaluates what is missing, then reports
  python benchmarks/encoder_only.py --runs=RUNS_DIR --out=...   # only the table of what is there

With --seeds, each seed K gets, one process at a time, the commands of configs/mlm.py and
configs/classify.py with
`--config.seed=K --config.data.shuffle_seed=K` (and `--config.data.data_dir=DATA_DIR`): the
masked LMs `mlm_cmudict_seedK` (configs/mlm.py:cmudict, 1000 steps) and `mlm_cmudict_3000_seedK`
(--config.train.num_steps=3000), each evaluated with `eval.py --split=test`, then for each label
fraction F the classifiers `scratch_F_seedK`, `pretrained_F_seedK` (--init_from the 1000-step LM)
and `pretrained3000_F_seedK` (the 3000-step LM), each evaluated with `eval.py --split=test
--step=best`. A workdir that already holds `metrics.test.json` is skipped (rerun to resume; an
interrupted training resumes from its checkpoint); each finished run's wall time is appended to
RUNS_DIR/walltimes.jsonl. --dry_run prints the commands instead. Run it under `nice` to share a machine.

The report reads every `<kind>_<fraction>_seed<K>/metrics.test.json` (seedless
`<kind>_<fraction>` workdirs count as seed 0, the seed they were trained with) and writes under
--out: table.md (per cell the mean test accuracy over seeds, its min-max range and the mean macro
F1), results.json (every seed's metrics and the per-cell summary, incl. the sample std) and
label_efficiency.png (the means with min-max error bars).
"""

import glob
import json
import os
import re
import subprocess
import sys
import time

from absl import app, flags
import numpy as np

from transformer.infer import viz

RUNS = flags.DEFINE_string("runs", None, "directory of the runs", required=True)
OUT = flags.DEFINE_string("out", "docs/results/encoder_only", "output directory")
SEEDS = flags.DEFINE_list("seeds", [], "seeds to train and evaluate first (missing runs only)")
DATA_DIR = flags.DEFINE_string("data_dir", None, "--config.data.data_dir of every run")
FRACTIONS = flags.DEFINE_list("fractions", ["0.01", "0.1", "1.0"], "label fractions")
DRY_RUN = flags.DEFINE_bool("dry_run", False, "print the missing runs' commands, run nothing")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ("scratch", "pretrained", "pretrained3000")
NAMES = {"scratch": "from scratch", "pretrained": "from the MLM checkpoint (1000 steps)",
         "pretrained3000": "from the MLM checkpoint (3000 steps)"}
INIT = {"pretrained": "mlm_cmudict", "pretrained3000": "mlm_cmudict_3000"}
MAJORITY = 0.7243  # class '1' among the 12,523 test words (data.label=primary_stress)
_WORKDIR = re.compile(r"(scratch|pretrained|pretrained3000)_([0-9.]+)(?:_seed([0-9]+))?")


def commands(runs: str, seed: int, fractions: list[str], data_dir: str | None,
             python: str = "python") -> list[tuple[str, list[str], list[str]]]:
  """(workdir, train argv, eval argv) of one seed's runs, in the order they must run (the
  masked LMs first: the pretrained classifiers start from them)."""
  common = [f"--config.seed={seed}", f"--config.data.shuffle_seed={seed}"]
  if data_dir:
    common.append(f"--config.data.data_dir={data_dir}")

  def one(name, train_args, eval_args):
    workdir = os.path.join(runs, f"{name}_seed{seed}")
    return (workdir, [python, "train.py", *train_args, f"--workdir={workdir}", *common],
            [python, "eval.py", f"--workdir={workdir}", "--split=test", *eval_args])

  out = [one("mlm_cmudict", ["--config=configs/mlm.py:cmudict"], []),
         one("mlm_cmudict_3000", ["--config=configs/mlm.py:cmudict",
                                  "--config.train.num_steps=3000"], [])]
  for fraction in fractions:
    for kind in KINDS:
      init = ([f"--init_from={os.path.join(runs, INIT[kind])}_seed{seed}"]
              if kind in INIT else [])
      out.append(one(f"{kind}_{fraction}", ["--config=configs/classify.py",
                                            f"--config.data.label_fraction={fraction}", *init],
                     ["--step=best"]))
  return out


def run_missing(runs: str, seeds: list[int], fractions: list[str], data_dir: str | None,
                dry_run: bool = False) -> None:
  """Trains and evaluates each run without a metrics.test.json, one at a time, from the repo."""
  for seed in seeds:
    for workdir, train, evaluate in commands(runs, seed, fractions, data_dir, sys.executable):
      if os.path.exists(os.path.join(workdir, "metrics.test.json")):
        continue
      if dry_run:
        print(" ".join(train[1:]), "&&", " ".join(evaluate[1:]))
        continue
      start = time.time()
      for argv in (train, evaluate):
        if subprocess.run(argv, cwd=REPO, check=False).returncode:
          raise SystemExit(f"{workdir}: `{' '.join(argv[1:])}` failed")
      with open(os.path.join(runs, "walltimes.jsonl"), "a") as f:
        f.write(json.dumps({"workdir": os.path.basename(workdir), "seed": seed,
                            "seconds": round(time.time() - start, 1)}) + "\n")


def collect(runs: str) -> dict[str, dict[float, dict[int, dict]]]:
  """{kind: {fraction: {seed: metrics.test.json}}} of the classifier workdirs under `runs`."""
  results: dict[str, dict[float, dict[int, dict]]] = {}
  where: dict[tuple, str] = {}
  for path in sorted(glob.glob(os.path.join(runs, "*", "metrics.test.json"))):
    name = os.path.basename(os.path.dirname(path))
    match = _WORKDIR.fullmatch(name)
    if not match:
      continue
    key = (match[1], float(match[2]), int(match[3] or 0))
    if key in where:
      raise ValueError(f"{runs}: {where[key]} and {name} are both {match[1]} at {match[2]} with "
                       f"seed {key[2]} (a seedless workdir counts as seed 0)")
    where[key] = name
    with open(path) as f:
      metrics = json.load(f)
    if "accuracy" not in metrics or "f1" not in metrics:
      raise ValueError(f"{path}: no accuracy/f1 (not a classifier evaluated on --split=test?)")
    results.setdefault(key[0], {}).setdefault(key[1], {})[key[2]] = metrics
  return results


def summarise(by_seed: dict[int, dict]) -> dict:
  """Mean, min, max and sample std (ddof=1; 0 for one seed) of the accuracy, mean macro F1."""
  acc = np.array([m["accuracy"] for _, m in sorted(by_seed.items())])
  return {"seeds": sorted(by_seed), "accuracy_mean": float(acc.mean()),
          "accuracy_min": float(acc.min()), "accuracy_max": float(acc.max()),
          "accuracy_std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
          "f1_mean": float(np.mean([m["f1"] for m in by_seed.values()]))}


def table(results: dict[str, dict[float, dict[int, dict]]]) -> list[str]:
  """Markdown rows: per cell the mean accuracy, [min-max] over the seeds, n seeds, mean F1."""
  fractions = sorted({f for runs in results.values() for f in runs})
  lines = ["| initialisation | " + " | ".join(f"{100 * f:g}% labels" for f in fractions) + " |",
           "|---|" + "---|" * len(fractions)]
  for kind in [k for k in KINDS if k in results]:
    cells = []
    for fraction in fractions:
      if fraction not in results[kind]:
        cells.append("-")
        continue
      s = summarise(results[kind][fraction])
      cells.append(f"{100 * s['accuracy_mean']:.1f}% [{100 * s['accuracy_min']:.1f}-"
                   f"{100 * s['accuracy_max']:.1f}, n={len(s['seeds'])}] (F1 {s['f1_mean']:.3f})")
    lines.append(f"| {NAMES[kind]} | " + " | ".join(cells) + " |")
  return lines


def report(runs: str, out: str) -> list[str]:
  """Writes table.md, results.json and label_efficiency.png under `out`; returns the table."""
  results = collect(runs)
  if not results:
    raise SystemExit(f"{runs}: no <kind>_<fraction>[_seed<K>]/metrics.test.json to report")
  lines = table(results)
  summary = {k: {f: summarise(by_seed) for f, by_seed in r.items()} for k, r in results.items()}
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump({NAMES[k]: {str(x): {"summary": summary[k][x],
                                   "per_seed": {str(s): m for s, m in sorted(by_seed.items())}}
                          for x, by_seed in sorted(r.items())}
               for k, r in results.items()}, f, indent=1)
  viz.plot_label_efficiency(
      {NAMES[k]: {x: s["accuracy_mean"] for x, s in r.items()} for k, r in summary.items()},
      baseline=MAJORITY, save_path=os.path.join(out, "label_efficiency.png"),
      spread={NAMES[k]: {x: (s["accuracy_min"], s["accuracy_max"]) for x, s in r.items()}
              for k, r in summary.items()})
  return lines


def main(argv):
  del argv
  try:
    seeds = [int(s) for s in SEEDS.value]
  except ValueError:
    raise SystemExit(f"--seeds={','.join(SEEDS.value)}: not a list of integers") from None
  if seeds:
    os.makedirs(RUNS.value, exist_ok=True)
    run_missing(os.path.abspath(RUNS.value), seeds, FRACTIONS.value, DATA_DIR.value,
                DRY_RUN.value)
  if not DRY_RUN.value:
    print("\n".join(report(RUNS.value, OUT.value)))


if __name__ == "__main__":
  app.run(main)
