r"""The flagship G2P measurement: train, select on validation, test; seeds; time-to-quality plot.

  python benchmarks/g2p_flagship.py --config=configs/g2p.py:tiny --seeds=0 --out=runs/flagship/tiny
  python benchmarks/g2p_flagship.py --config=configs/g2p.py:fast --seeds=0,1,2 \
      --out=runs/flagship/fast --data_dir=/tmp/g2p_data
  python benchmarks/g2p_flagship.py --config=configs/g2p.py:fast --seeds=0 --out=/tmp/f \
      --config.train.num_steps=500                        # --config.* flags pass on to train.py
  python benchmarks/g2p_flagship.py --config=configs/g2p.py:fast --seeds=0,1,2 --ensemble \
      --out=runs/flagship/fast                             # then the ensembles of seeds 0,1 and 0,1,2
  python benchmarks/g2p_flagship.py --config=configs/g2p.py:gpu --seeds=0,1,2,3 --members \
      --ensemble --out=runs/flagship/gpu4                  # the seeds as one vmapped program
  python benchmarks/g2p_flagship.py --plot=runs/flagship/fast,runs/flagship/best \
      --save=docs/results/g2p_time_to_quality.png          # several configs on one plot

One seed is one uninterrupted, timed pipeline, start to finish:
  1. `python train.py --config=CONFIG --config.seed=K --config.data.shuffle_seed=K ...` (the config
     evaluates the validation split during training and keeps the best checkpoint by its WER);
  2. `python eval.py --split=test --step=best`: the whole test split, the checkpoint selected on
     validation, the config's own decoding (beam size and length penalty are part of the config,
     chosen beforehand on validation);
  3. the wall-clock seconds of 1+2 (data preparation and compilation included: the first seed
     of a fresh --data_dir prepares the data, which its time includes), with what the machine's
     load was at the start and end (the numbers are claims only on an otherwise idle machine).
With `--ensemble`, the ensembles of the first 2, 3, ... seeds are then evaluated as one model each
(`eval.py --ensemble`, every member at its best checkpoint on validation) on both splits, into
`<out>/ensemble<seeds>`; an ensemble's wall clock is its members' training times added up (trained
one after another) plus its own test evaluation.
Each seed's workdir is `<out>/seed<K>`; `<out>/summary.json` holds every seed's validation and test
metrics, wall time, the commands, and mean / min / max / standard deviation over the seeds. A
finished seed is not rerun (its summary entry is kept), so an interrupted campaign resumes.

The plot: validation WER of every evaluation against its wall-clock minute (metrics.jsonl's
`time/elapsed_s`), one line per seed and configuration, and the test WER as a star at the minute
the test evaluation finished.

With `--members`, the seeds train as one `train.members` program (one train.py, the members'
workdirs `<out>/members/seed=K`, the same batches for all), each member is tested as above, and
every seed's train_s is the program's; an ensemble's wall clock is then that one program plus its
own test evaluation.
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
METRICS = ("wer", "per", "loss", "accuracy")


def _run(cmd: list[str]) -> None:
  """Runs a train.py / eval.py command from the repository root; a one-line exit if it fails."""
  proc = commands.run(cmd, cwd=REPO)
  if proc.returncode:
    raise SystemExit(f"g2p_flagship: `{' '.join(cmd[1:3])} ...` {commands.failure(proc)}")


def seed_dir(out: str, seed: int | str, members: bool) -> str:
  """A seed's workdir: `<out>/seed<K>`, or `<out>/members/seed=K` for a members program."""
  return os.path.join(out, "members", f"seed={seed}") if members else os.path.join(
      out, f"seed{seed}")


def run_seed(config: str, seed: int, workdir: str, data_dir: str, extra: list[str]) -> dict:
  """Trains and tests one seed; returns its summary entry."""
  train_cmd = [sys.executable, "train.py", f"--config={config}", f"--workdir={workdir}",
               f"--config.seed={seed}", f"--config.data.shuffle_seed={seed}", *extra]
  if data_dir:
    train_cmd.append(f"--config.data.data_dir={data_dir}")
  load_start, start = os.getloadavg()[0], time.time()
  _run(train_cmd)
  return test_seed(seed, workdir, data_dir, train_cmd, load_start, start, time.time())


def run_members(config: str, seeds: list[int], out: str, data_dir: str,
                extra: list[str]) -> dict[str, dict]:
  """Trains `seeds` as one train.members program, then tests each; returns their entries."""
  train_cmd = [sys.executable, "train.py", f"--config={config}",
               f"--workdir={os.path.join(out, 'members')}", f"--config.seed={seeds[0]}",
               f"--config.data.shuffle_seed={seeds[0]}",
               "--config.train.members=" + ";".join(f"seed={s}" for s in seeds), *extra]
  if data_dir:
    train_cmd.append(f"--config.data.data_dir={data_dir}")
  load_start, start = os.getloadavg()[0], time.time()
  _run(train_cmd)
  trained = time.time()
  return {str(s): test_seed(s, seed_dir(out, s, True), data_dir, train_cmd, load_start, start,
                            trained) for s in seeds}


def test_seed(seed: int, workdir: str, data_dir: str, train_cmd: list[str], load_start: float,
              start: float, trained: float) -> dict:
  """Tests one trained seed at its best checkpoint on validation; returns its summary entry (its
  wall clock: the training from `start` to `trained`, then its own test evaluation)."""
  test_cmd = [sys.executable, "eval.py", f"--workdir={workdir}", "--split=test", "--step=best"]
  if data_dir:
    test_cmd.append(f"--config.data.data_dir={data_dir}")
  test_start = time.time()
  _run(test_cmd)
  test_s = time.time() - test_start
  with open(os.path.join(workdir, "train_done.json")) as f:
    done = json.load(f)
  with open(os.path.join(workdir, "metrics.test.json")) as f:
    test = json.load(f)
  best = best_validation(workdir)
  return {"seed": seed, "train_s": round(trained - start, 1), "test_s": round(test_s, 1),
          "wall_clock_s": round(trained - start + test_s, 1), "load_start": load_start,
          "load_end": os.getloadavg()[0], "steps": done.get("step"),
          "validation": best, "test": {k: test.get(f"eval/{k}", test.get(k)) for k in METRICS},
          "commands": [train_cmd[1:], test_cmd[1:]]}


def best_validation(workdir: str) -> dict:
  """The validation metrics of the evaluation with the lowest WER (the checkpoint --step=best)."""
  rows = metrics_log.read(workdir)
  evals = [r for r in rows if "eval/wer" in r]
  if not evals:
    raise SystemExit(f"g2p_flagship: {workdir}/metrics.jsonl has no eval/wer row")
  row = min(evals, key=lambda r: r["eval/wer"])
  return {"step": row["step"], "minutes": round(row.get("time/elapsed_s", 0) / 60, 2)} | {
      k: row.get(f"eval/{k}") for k in METRICS}


def stats(values: list[float]) -> dict[str, float]:
  """mean, min, max and (n > 1) standard deviation of `values`."""
  return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
          "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def spread(entries: list[dict], split: str) -> dict:
  """`stats` of each metric of `split` over the seeds."""
  out = {}
  for k in METRICS:
    values = [e[split][k] for e in entries if e[split].get(k) is not None]
    if values:
      out[k] = stats(values)
  return out


def campaign(args) -> dict:
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "summary.json")
  summary = {"config": args.config, "extra": args.extra, "members": args.members, "seeds": {}}
  if os.path.exists(path):
    with open(path) as f:
      summary = json.load(f)
    if (summary["config"] != args.config or summary.get("extra", []) != args.extra
        or summary.get("members", False) != args.members):
      raise SystemExit(f"g2p_flagship: {path} is a campaign of {summary['config']} "
                       f"{summary.get('extra')}{' as members' if summary.get('members') else ''}"
                       "; use another --out")
  seeds = [int(s) for s in args.seeds.split(",")]
  if args.members and not all(str(s) in summary["seeds"] for s in seeds):
    # One program trains every seed; an interrupted one resumes from its checkpoints.
    trained = run_members(args.config, seeds, args.out, args.data_dir, args.extra)
  for seed in seeds:
    if str(seed) in summary["seeds"]:
      continue
    entry = trained[str(seed)] if args.members else run_seed(
        args.config, seed, seed_dir(args.out, seed, False), args.data_dir, args.extra)
    summary["seeds"][str(seed)] = entry
    entries = list(summary["seeds"].values())
    summary["validation"] = spread(entries, "validation")
    summary["test"] = spread(entries, "test")
    summary["wall_clock_s"] = stats([e["wall_clock_s"] for e in entries])
    with open(path, "w") as f:
      json.dump(summary, f, indent=1)
    print(f"seed {seed}: test WER {entry['test']['wer']:.2%} PER {entry['test']['per']:.2%}, "
          f"validation WER {entry['validation']['wer']:.2%}, {entry['wall_clock_s'] / 60:.1f} min "
          f"(load {entry['load_start']:.1f} -> {entry['load_end']:.1f})", flush=True)
  return summary


def run_ensemble(seeds: list[str], out: str, data_dir: str, summary: dict) -> dict:
  """Evaluates the ensemble of `seeds`' runs (each at its best checkpoint on validation) on the
  validation and test splits; its wall clock is the pipeline that produces its test number: the
  members trained one after another (their train_s; one program's with --members) plus the
  ensemble's test evaluation."""
  members = summary.get("members", False)
  workdirs = [seed_dir(out, s, members) for s in seeds]
  target = os.path.join(out, "ensemble" + "_".join(seeds))
  entry: dict = {"seeds": [int(s) for s in seeds], "commands": []}
  for split in ("validation", "test"):
    cmd = [sys.executable, "eval.py", f"--workdir={workdirs[0]}",
           f"--ensemble={','.join(workdirs[1:])}", f"--out={target}", f"--split={split}",
           "--step=best"] + ([f"--config.data.data_dir={data_dir}"] if data_dir else [])
    start = time.time()
    _run(cmd)
    entry[f"{split}_s"] = round(time.time() - start, 1)
    with open(os.path.join(target, f"metrics.{split}.json")) as f:
      metrics = json.load(f)
    entry[split] = {k: metrics.get(k) for k in METRICS}
    entry["commands"].append(cmd[1:])
  train_s = [summary["seeds"][s]["train_s"] for s in seeds]
  entry["wall_clock_s"] = round((max(train_s) if members else sum(train_s)) + entry["test_s"], 1)
  return entry


def ensembles(args, summary: dict) -> None:
  """The ensembles of the first 2, 3, ... seeds (`--ensemble`), added to the summary."""
  path = os.path.join(args.out, "summary.json")
  seeds = [s for s in (str(int(s)) for s in args.seeds.split(",")) if s in summary["seeds"]]
  for k in range(2, len(seeds) + 1):
    name = ",".join(seeds[:k])
    if name in summary.setdefault("ensembles", {}):
      continue
    entry = run_ensemble(seeds[:k], args.out, args.data_dir, summary)
    summary["ensembles"][name] = entry
    with open(path, "w") as f:
      json.dump(summary, f, indent=1)
    print(f"ensemble of seeds {name}: test WER {entry['test']['wer']:.2%} PER "
          f"{entry['test']['per']:.2%}, validation WER {entry['validation']['wer']:.2%} (the whole "
          f"split), "
          f"{entry['wall_clock_s'] / 60:.1f} min (the members' training "
          f"{'as one program' if summary.get('members') else 'one after another'} + "
          f"the ensemble's test evaluation)", flush=True)


def plot(outs: list[str], save: str) -> None:
  sys.path.insert(0, REPO)
  from transformer.run import curves  # pylint: disable=g-import-not-at-top  (matplotlib only here)
  runs, finals = {}, {}
  summaries = []
  for out in outs:
    with open(os.path.join(out, "summary.json")) as f:
      summaries.append(json.load(f))
  names = [s["config"].rsplit("/", 1)[-1] for s in summaries]
  for out, summary, name in zip(outs, summaries, names):
    if names.count(name) > 1:  # two campaigns of one config (e.g. before and after a change)
      name = f"{name} ({os.path.basename(os.path.normpath(out))})"
    for seed, entry in summary["seeds"].items():
      label = f"{name} seed {seed}"
      runs[label] = seed_dir(out, seed, summary.get("members", False))
      finals[label] = (entry["wall_clock_s"] / 60, entry["test"]["wer"])
  curves.plot_time_to_quality(runs, key="eval/wer", finals=finals, save_path=save)
  print(f"wrote {save}")


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/g2p.py:fast")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--out", default="", help="the campaign's directory (one workdir per seed)")
  parser.add_argument("--data_dir", default="", help="prepared data (default: the config's)")
  parser.add_argument("--ensemble", action="store_true",
                      help="after the seeds, evaluate the ensembles of the first 2, 3, ... seeds")
  parser.add_argument("--members", action="store_true",
                      help="train the seeds as one train.members program (see the docstring)")
  parser.add_argument("--plot", default="", help="comma-separated campaign directories to plot")
  parser.add_argument("--save", default="g2p_time_to_quality.png", help="the plot's PNG path")
  args, extra = parser.parse_known_args(argv)
  args.extra = extra  # more train.py flags, e.g. --config.train.num_steps=500
  unknown = [a for a in extra if not a.startswith("--config.")]
  if unknown:
    parser.error(f"unknown arguments {unknown} (only --config.* flags pass on to train.py)")
  if args.plot:
    plot([p for p in args.plot.split(",") if p], args.save)
    return
  if not args.out:
    parser.error("--out is required (the campaign's directory)")
  if args.members and len(args.seeds.split(",")) < 2:
    parser.error("--members needs at least two --seeds")
  summary = campaign(args)
  if args.ensemble:
    ensembles(args, summary)
  t, v = summary["test"], summary["validation"]
  print(f"{args.config}, seeds {','.join(summary['seeds'])}: test WER {t['wer']['mean']:.2%} "
        f"(min {t['wer']['min']:.2%}, max {t['wer']['max']:.2%}), PER {t['per']['mean']:.2%}; "
        f"validation WER {v['wer']['mean']:.2%}; wall clock {summary['wall_clock_s']['mean'] / 60:.1f}"
        f" min (max {summary['wall_clock_s']['max'] / 60:.1f})")


if __name__ == "__main__":
  main()
