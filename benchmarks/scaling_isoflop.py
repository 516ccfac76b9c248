r"""A CPU-sized IsoFLOP study of a character LM: fit scaling laws on the lower budgets, predict the
top one. Three stages, each through the project's own commands:

  1. the learning-rate scan (configs/sweeps/isoflop_lr.py: 5 shapes x 4 rates on 5e10 FLOPs, 2
     shapes at a fifth); the rate of the lowest mean regret (final validation loss minus the
     best of its shape) is the study's;
  2. the IsoFLOP sweep (configs/sweeps/isoflop.py: 4 budgets x 7 sizes x seeds 0, 1; the seeds of
     a size packed as members) at that rate;
  3. `python -m transformer.scaling fit SWEEP --holdout=<top budget>`: Approach 2 and Approach 3
     on the 3 lower budgets, their predictions of the top budget's best loss and size checked
     against its runs (goals: loss within 2%, size within 1.5x).

  python benchmarks/scaling_isoflop.py --workdir=runs/scaling_isoflop --out=docs/results
      # ~30 minutes on 2 shared cores; reruns skip finished runs (sweep.py resumes)

The corpus is Tiny Shakespeare (../shared/data/tinyshakespeare.txt, pinned by its sha256 below;
--text_file to use another copy), split 90/10 (train/validation). Writes
OUT/scaling_isoflop/record.json, scaling.json (every run and both fits, the fit command's) and
scaling.png beside it, and study.json (the scan's losses, each run's epochs over the training
split); the last line printed is the record's path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time

import commands  # benchmarks/ is the script's directory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "configs/lm.py:isoflop"
TEXT_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
HOLDOUT = 2e11  # configs/sweeps/isoflop.py's top budget


def sha256(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def sweep(name: str, sweep_file: str, workdir: str, pack: int, extra: list[str]) -> float:
  """Runs sweep.py to its end, two packs at a time (one per core); its wall clock in seconds."""
  cmd = [sys.executable, "sweep.py", f"--config={CONFIG}", f"--sweep={sweep_file}",
         f"--workdir={workdir}", f"--pack={pack}", "--parallel=2", "--eval_split=", *extra]
  print(f"[{name}] {' '.join(cmd[1:])}", flush=True)
  start = time.time()
  proc = commands.run(cmd, cwd=REPO)
  if proc.returncode:
    raise SystemExit(f"scaling_isoflop: the {name} sweep {commands.failure(proc)}")
  return time.time() - start


def final_losses(workdir: str) -> list[dict]:
  """Each point's learning rate, shape and final validation loss (its last eval/loss)."""
  rows = []
  for name in sorted(os.listdir(workdir)):
    path = os.path.join(workdir, name)
    if not os.path.isfile(os.path.join(path, "config.json")):
      continue
    with open(os.path.join(path, "config.json")) as f:
      cfg = json.load(f)
    with open(os.path.join(path, "metrics.jsonl")) as f:
      losses = [r["eval/loss"] for r in map(json.loads, f) if "eval/loss" in r]
    rows.append({"point": name, "learning_rate": cfg["train"]["learning_rate"],
                 "d_model": cfg["model"]["d_model"],
                 "layers": cfg["model"]["num_decoder_layers"],
                 "loss": losses[-1] if losses else None})
  return rows


def best_rate(rows: list[dict]) -> tuple[float, dict[str, float]]:
  """The rate of the lowest mean regret (its final loss minus the best of its shape) over the
  shapes it was run at, and each rate's mean regret."""
  best = {}
  for r in rows:
    shape = (r["d_model"], r["layers"])
    best[shape] = min(best.get(shape, float("inf")), r["loss"])
  regrets: dict[str, list[float]] = {}
  for r in rows:
    regrets.setdefault(repr(r["learning_rate"]), []).append(
        r["loss"] - best[(r["d_model"], r["layers"])])
  means = {rate: sum(v) / len(v) for rate, v in regrets.items()}
  return float(min(means, key=means.get)), means


def metrics(result: dict, rate: float, epochs: list[float]) -> dict[str, float]:
  """The record's flat metrics: both fits, the held-out budget's observation and predictions."""
  a2, a3 = result["approach2"], result["approach3"]
  name = next(iter(result["held_out"]))
  held, seen = result["held_out"][name], result["held_out"][name]["observed"]
  out = {"learning_rate": rate, "runs": len(result["runs"]),
         "budgets": len(result["fitted_budgets"]) + len(result["held_out_budgets"]),
         "held_out_budget_flops": float(name), "epochs_max": max(epochs),
         "epochs_min": min(epochs), "a2_a": a2["a"], "a2_b": a2["b"], "a3_a": a3["a"],
         "a3_b": a3["b"], "a3_alpha": a3["alpha"], "a3_beta": a3["beta"], "a3_E": a3["E"],
         "observed_best_loss": seen["best_loss"],
         "observed_best_params": seen["vertex_params"] or seen["best_loss_params"]}
  for tag, fit in (("a2", a2), ("a3", a3)):
    p = fit["predictions"][name]
    out |= {f"{tag}_pred_loss": p["loss"], f"{tag}_pred_params": p["n_opt"],
            f"{tag}_pred_tokens": p["d_opt"],
            f"{tag}_loss_error_pct": 100 * held["approach2" if tag == "a2" else "approach3"][
                "loss_error"],
            f"{tag}_size_ratio": held["approach2" if tag == "a2" else "approach3"]["size_ratio"]}
    for k in ("loss", "n_opt"):
      low_high = p["intervals"][k]
      if low_high:
        short = "loss" if k == "loss" else "params"
        out |= {f"{tag}_pred_{short}_lo": low_high[0], f"{tag}_pred_{short}_hi": low_high[1]}
  return {k: round(v, 6) if isinstance(v, float) else v for k, v in out.items()}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True, help="holds the scan's and the sweep's workdirs")
  parser.add_argument("--out", default="docs/results", help="writes OUT/scaling_isoflop/")
  parser.add_argument("--text_file", default="../shared/data/tinyshakespeare.txt",
                      help="the corpus, relative to the repository root (where the runs start)")
  parser.add_argument("--bootstrap", type=int, default=200)
  args = parser.parse_args()
  text_file = os.path.join(REPO, args.text_file)
  if not os.path.isfile(text_file):
    raise SystemExit(f"scaling_isoflop: {text_file} not found (Tiny Shakespeare; --text_file)")
  if sha256(text_file) != TEXT_SHA256:
    raise SystemExit(f"scaling_isoflop: {text_file} is not the pinned Tiny Shakespeare "
                     f"(sha256 {TEXT_SHA256})")
  data = ["--config.data.dataset=text_files", f"--config.data.text_file={args.text_file}"]
  scan_dir, sweep_dir = (os.path.join(args.workdir, n) for n in ("lr_scan", "isoflop"))
  start = time.time()
  scan_wall = sweep("scan", "configs/sweeps/isoflop_lr.py", scan_dir, 6, data)
  scan = final_losses(scan_dir)
  rate, means = best_rate(scan)
  print(f"learning rate {rate:g} (mean regret by rate: {means})", flush=True)
  sweep_wall = sweep("isoflop", "configs/sweeps/isoflop.py", sweep_dir, 2,
                     data + [f"--config.train.learning_rate={rate!r}"])
  directory = os.path.join(args.out, "scaling_isoflop")
  fit = [sys.executable, "-m", "transformer.scaling", "fit", sweep_dir, f"--holdout={HOLDOUT:g}",
         f"--bootstrap={args.bootstrap}", f"--out={directory}"]
  proc = commands.run(fit, cwd=REPO)
  if proc.returncode:
    raise SystemExit(f"scaling_isoflop: the fit {commands.failure(proc)}")
  print(proc.stdout, flush=True)
  wall = time.time() - start
  with open(os.path.join(directory, "scaling.json")) as f:
    result = json.load(f)
  with open(text_file, encoding="utf-8") as f:
    train_chars = int(0.9 * len(f.read()))
  epochs = [r["tokens"] / train_chars for r in result["runs"]]
  record = {
      "name": "scaling_isoflop",
      "title": "IsoFLOP study of a character LM: 4 budgets x 7 sizes x 2 seeds, the top budget "
               "predicted from the lower three",
      "task": "character LM (Tiny Shakespeare, sha256 " + TEXT_SHA256[:12] + "...)",
      "config": CONFIG, "overrides": data + [f"--config.train.learning_rate={rate!r}"],
      "command": " ".join(["python", "benchmarks/scaling_isoflop.py", *sys.argv[1:]]),
      "commit": commands.git_commit(),
      "hardware": f"{os.cpu_count()}-core {platform.machine()} CPU (shared)",
      "versions": {"python": platform.python_version()} | commands.versions(
          "jax", "flax", "scipy", "numpy"),
      "wall_clock_s": round(wall, 1),
      "rates": {}, "metrics": metrics(result, rate, epochs) | {
          "scan_wall_clock_s": round(scan_wall, 1), "sweep_wall_clock_s": round(sweep_wall, 1)},
      "seeds": [0, 1], "report": "docs/scaling.md#a-measured-isoflop-study"}
  study = {"learning_rate_scan": scan, "mean_regret_by_rate": means, "fit_command": " ".join(
      ["python", *fit[1:]]), "epochs": {r["path"]: e for r, e in zip(result["runs"], epochs)},
      "train_chars": train_chars, "text_sha256": TEXT_SHA256}
  for name, content in (("record.json", record), ("study.json", study)):
    with open(os.path.join(directory, name), "w") as f:
      json.dump(content, f, indent=1)
      f.write("\n")
  print(json.dumps(record["metrics"]))
  print(os.path.join(directory, "record.json"))


if __name__ == "__main__":
  main()
