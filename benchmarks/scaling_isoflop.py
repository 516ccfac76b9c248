r"""A CPU-sized IsoFLOP study of a character LM: fit scaling laws on the lower budgets, predict the
top one. Three stages, each through the project's own commands:

  1. the learning-rate scan (configs/sweeps/isoflop_lr.py: the smallest budget's smallest, middle
     and largest sizes x 5 rates, under µP); the rate of the lowest mean regret (final validation
     loss minus the best of its shape) is the study's, for every size and budget;
  2. the IsoFLOP sweep (configs/sweeps/isoflop.py: 4 budgets x 7 sizes x seeds 0, 1; the seeds of
     a size packed as members) at that rate;
  3. `python -m transformer.scaling fit SWEEP --holdout=<top budget>`: Approach 2 and Approach 3
     on the 3 lower budgets, their predictions of the top budget's best loss and size checked
     against its runs (goals: loss within 2%, size within 1.5x).

  python benchmarks/scaling_isoflop.py --workdir=runs/scaling_isoflop --out=docs/results
      # ~25 minutes on 2 shared cores; reruns skip finished runs (sweep.py resumes)
  python benchmarks/scaling_isoflop.py --workdir=runs/scaling_isoflop --out=docs/results --rebuild
      # trains nothing: the record from the finished runs (refused if a point is unfinished)

The record is written whatever the fits say: an approach that cannot be fitted is recorded as
refused with its reason (`refused`), and `goals` states each bound and whether it was met.

The corpus is Tiny Shakespeare (../shared/data/tinyshakespeare.txt, pinned by its sha256 below;
--text_file to use another copy), split 90/10 (train/validation). Writes
OUT/scaling_isoflop/record.json, scaling.json (every run and both fits) and, where both fits
ran, scaling.png beside it, and study.json (the scan's losses, each run's epochs over the training
split); the last line printed is the record's path.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import platform
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # this tree's transformer, not an installed one

import commands  # noqa: E402  (benchmarks/ is the script's directory)
from transformer.scaling import fits, observations, plots  # noqa: E402
CONFIG = "configs/lm.py:isoflop"
TEXT_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
HOLDOUT = 2e11  # configs/sweeps/isoflop.py's top budget
SCAN_BUDGET = 2.5e10  # configs/sweeps/isoflop_lr.py's budget: the sweep's smallest
GOALS = {"loss_within_2pct": ("loss_error", 0.02, "|predicted best loss / observed - 1| <= 0.02"),
         "size_within_1.5x": ("size_ratio", 1.5,
                              "max(predicted N* / observed, its inverse) <= 1.5")}


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


def unfinished(workdir: str) -> tuple[int, list[str]]:
  """A sweep's point count (its sweep.json) and the points without a train_done.json."""
  path = os.path.join(workdir, "sweep.json")
  if not os.path.isfile(path):
    raise SystemExit(f"scaling_isoflop: {path} not found (run the sweeps first, without --rebuild)")
  with open(path) as f:
    points = json.load(f)["points"]
  return len(points), [p["name"] for p in points
                       if not os.path.isfile(os.path.join(workdir, p["name"], "train_done.json"))]


def pack_seconds(workdir: str) -> float:
  """A sweep's training wall clock summed over its packs (results.csv's wall_seconds, which the
  points of one pack share); the sweep ran two packs at a time."""
  with open(os.path.join(workdir, "results.csv")) as f:
    seconds = {(r["wall_seconds"], r["d_model"], r["dec_layers"]) for r in csv.DictReader(f)
               if r["status"] == "done"}
  return round(sum(float(w) for w, *_ in seconds), 1)


def metrics(result: dict, rate: float, epochs: list[float]) -> dict[str, float]:
  """The record's flat metrics: the fits that ran, the held-out budget's observation and each
  fitted approach's prediction there with its 95% bootstrap interval."""
  name = next(iter(result["held_out"]))
  held, seen = result["held_out"][name], result["held_out"][name]["observed"]
  out = {"learning_rate": rate, "runs": len(result["runs"]),
         "budgets": len(result["fitted_budgets"]) + len(result["held_out_budgets"]),
         "held_out_budget_flops": float(name), "epochs_max": max(epochs),
         "epochs_min": min(epochs), "observed_best_loss": seen["best_loss"],
         "observed_best_params": seen["vertex_params"] or seen["best_loss_params"]}
  for tag in ("a2", "a3"):
    fit = result["approach2" if tag == "a2" else "approach3"]
    if "refused" in fit:
      continue
    for k in ("a", "b", "alpha", "beta", "E"):
      if k in fit:
        out[f"{tag}_{k}"] = fit[k]
        if fit.get("intervals", {}).get(k):
          out |= {f"{tag}_{k}_lo": fit["intervals"][k][0], f"{tag}_{k}_hi": fit["intervals"][k][1]}
    p, check = fit["predictions"][name], held["approach2" if tag == "a2" else "approach3"]
    out |= {f"{tag}_pred_loss": p["loss"], f"{tag}_pred_params": p["n_opt"],
            f"{tag}_pred_tokens": p["d_opt"], f"{tag}_loss_error_pct": 100 * check["loss_error"],
            f"{tag}_size_ratio": check["size_ratio"]}
    for k, short in (("loss", "loss"), ("n_opt", "params")):
      if p["intervals"][k]:
        out |= {f"{tag}_pred_{short}_lo": p["intervals"][k][0],
                f"{tag}_pred_{short}_hi": p["intervals"][k][1]}
  return {k: round(v, 6) if isinstance(v, float) else v for k, v in out.items()}


def goals(result: dict) -> dict[str, dict]:
  """Each goal's bound and, per approach, its value at the held-out budget and whether it was met
  (a refused approach meets none)."""
  held = next(iter(result["held_out"].values()))
  out = {}
  for goal, (measure, bound, text) in GOALS.items():
    out[goal] = {"bound": bound, "test": text}
    for name in ("approach2", "approach3"):
      if "refused" in result[name]:
        out[goal][name] = {"met": False, "refused": True}
      else:
        value = held[name][measure]
        out[goal][name] = {"value": round(value, 6), "met": bool(held[name][goal])}
  return out


def seed_spread(result: dict) -> dict[str, list[float]]:
  """The held-out budget's best loss over its seeds: [lowest, highest] at the size of its lowest
  mean."""
  seen = next(iter(result["held_out"].values()))["observed"]
  losses = [r["loss"] for r in result["runs"] if r["budget"] >= HOLDOUT / 1.1
            and r["params"] == seen["best_loss_params"]]
  return {"observed_best_loss": [round(min(losses), 6), round(max(losses), 6)]}


def fit(sweep_dir: str, directory: str, samples: int) -> dict:
  """Both fits on the budgets below HOLDOUT, an approach that cannot be fitted recorded as
  refused; writes scaling.json (and scaling.png where both ran)."""
  obs = observations.read([sweep_dir], "eval/loss", "non_embedding")
  result = fits.analyse(obs, HOLDOUT, (), samples, refusals=True) | {"params": "non_embedding"}
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "scaling.json"), "w") as f:
    json.dump(result, f, indent=1, default=lambda v: v.item())  # numpy scalars
    f.write("\n")
  refused = {n: result[n] for n in ("approach2", "approach3") if "refused" in result[n]}
  if not refused:
    plots.plot(result, os.path.join(directory, "scaling.png"))
  for name, why in refused.items():
    print(f"{name} refused: {why['refused']}", flush=True)
  return result


def sweeps(args: argparse.Namespace, data: list[str], scan_dir: str, sweep_dir: str
           ) -> tuple[float | None, float | None]:
  """Runs (or with --rebuild checks) the scan and the sweep; each one's wall clock, measured
  here (None with --rebuild)."""
  if args.rebuild:
    for d in (scan_dir, sweep_dir):
      total, missing = unfinished(d)
      if missing:
        raise SystemExit(f"scaling_isoflop: {d}: {len(missing)} of {total} points unfinished "
                         f"({missing[0]}, ...); run without --rebuild to train them")
      print(f"{d}: {total} points, all finished", flush=True)
    return None, None
  scan_wall = sweep("scan", "configs/sweeps/isoflop_lr.py", scan_dir, 5, data)
  rate, _ = best_rate(final_losses(scan_dir))
  sweep_wall = sweep("isoflop", "configs/sweeps/isoflop.py", sweep_dir, 2,
                     data + [f"--config.train.learning_rate={rate!r}"])
  return scan_wall, sweep_wall


def record(result: dict, rate: float, epochs: list[float], data: list[str],
           walls: tuple[float | None, ...]) -> dict:
  """The study's record: provenance, the flat metrics, the refusals and the goals."""
  scan_wall, sweep_wall, wall = walls
  out = {
      "name": "scaling_isoflop",
      "title": "IsoFLOP study of a character LM: 4 budgets x 7 sizes x 2 seeds, the top budget "
               "predicted from the lower three; µP, one learning rate for every width, chosen "
               f"by a scan at the smallest budget ({SCAN_BUDGET:g} FLOPs)",
      "task": f"Character LM (tiny Shakespeare, sha256 {TEXT_SHA256[:8]}), IsoFLOP fits to "
              f"{HOLDOUT:g} FLOPs held out",
      "config": CONFIG, "overrides": data + [f"--config.train.learning_rate={rate!r}"],
      "command": " ".join(["python", "benchmarks/scaling_isoflop.py", *sys.argv[1:]]),
      "commit": commands.git_commit(),
      "hardware": f"{os.cpu_count()}-core {platform.machine()} CPU (shared)",
      "versions": {"python": platform.python_version()} | commands.versions(
          "jax", "flax", "scipy", "numpy"),
      "wall_clock_s": None if wall is None else round(wall, 1),
      "rates": {}, "metrics": metrics(result, rate, epochs),
      "seeds": sorted({r["seed"] for r in result["runs"]}), "spread": seed_spread(result),
      "goals": goals(result), "report": "docs/scaling.md#a-measured-isoflop-study"}
  if scan_wall is not None:
    out["metrics"] |= {"scan_wall_clock_s": round(scan_wall, 1),
                       "sweep_wall_clock_s": round(sweep_wall, 1)}
  refused = {n: {"reason": result[n]["refused"], "fitted_budgets": result[n]["budgets"]}
             for n in ("approach2", "approach3") if "refused" in result[n]}
  if refused:
    out["refused"] = refused
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True, help="holds the scan's and the sweep's workdirs")
  parser.add_argument("--out", default="docs/results", help="writes OUT/scaling_isoflop/")
  parser.add_argument("--text_file", default="../shared/data/tinyshakespeare.txt",
                      help="the corpus, relative to the repository root (where the runs start)")
  parser.add_argument("--bootstrap", type=int, default=200)
  parser.add_argument("--rebuild", action="store_true",
                      help="train nothing: the record from the finished runs")
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
  scan_wall, sweep_wall = sweeps(args, data, scan_dir, sweep_dir)
  scan = final_losses(scan_dir)
  rate, means = best_rate(scan)
  print(f"learning rate {rate:g} (mean regret by rate: {means})", flush=True)
  directory = os.path.join(args.out, "scaling_isoflop")
  result = fit(sweep_dir, directory, args.bootstrap)
  wall = None if args.rebuild else time.time() - start
  with open(text_file, encoding="utf-8") as f:
    train_chars = int(0.9 * len(f.read()))
  epochs = [r["tokens"] / train_chars for r in result["runs"]]
  rec = record(result, rate, epochs, data, (scan_wall, sweep_wall, wall))
  rec["metrics"] |= {"lr_scan_budget_flops": SCAN_BUDGET, "lr_scan_runs": len(scan),
                     "lr_scan_pack_seconds": pack_seconds(scan_dir),
                     "sweep_pack_seconds": pack_seconds(sweep_dir)}
  study = {"learning_rate_scan": scan, "mean_regret_by_rate": means,
           "fit": f"transformer.scaling.fits.analyse({sweep_dir!r}'s runs, holdout={HOLDOUT:g}, "
                  f"samples={args.bootstrap}, refusals=True)",
           "epochs": {r["path"]: e for r, e in zip(result["runs"], epochs)},
           "train_chars": train_chars, "text_sha256": TEXT_SHA256}
  for name, content in (("record.json", rec), ("study.json", study)):
    with open(os.path.join(directory, name), "w") as f:
      json.dump(content, f, indent=1)
      f.write("\n")
  print(json.dumps(rec["metrics"]))
  print(os.path.join(directory, "record.json"))


if __name__ == "__main__":
  main()
