r"""N members in one program against one run: the wall clocks of `train.py` with
`train.members=seeds:N` and without it, same config, same steps, one after the other.

  python benchmarks/members.py --config=configs/g2p.py:fast --members=8 --out=/tmp/members
  python benchmarks/members.py --config=configs/g2p.py:fast --members=2 --out=/tmp/m \
      --config.train.num_steps=4 --config.eval.every_steps=4 \
      --config.eval.num_decode_examples=8              # a check that it runs, on a CPU
  (--config.* flags pass on to both train.py commands)

Each run is one `python train.py` process, timed start to finish (imports, data loading,
compilation, training, in-training evaluations with their decoding, each member's own, and the
checkpoints): what a researcher waits for. The single run goes first, so it pays for preparing
the data of a fresh --config.data.data_dir; prepare it beforehand for a fair ratio. Also
reported per run: the training rate it logged (the median of metrics.jsonl's perf/steps_per_sec,
which leaves evaluations and compilation out), and for the members its first member's. The last
line is one JSON record: {"config", "extra", "members", "device", "one": {...}, "many": {...},
"wall_clock_ratio", "steps_per_s_ratio"}; "wall_clock_ratio" is many / one (the goal: <= 1.5
for 8 seeds of configs/g2p.py:fast on one GPU).
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


def timed_train(config: str, workdir: str, extra: list[str]) -> dict:
  """Runs train.py once; returns its wall clock, median logged steps/s and final step."""
  cmd = [sys.executable, "train.py", f"--config={config}", f"--workdir={workdir}", *extra]
  start = time.time()
  proc = commands.run(cmd, cwd=REPO)
  wall = time.time() - start
  if proc.returncode:
    raise SystemExit(f"members: `train.py --workdir={workdir}` {commands.failure(proc)}")
  dirs = sorted(d for d in os.listdir(workdir) if os.path.isdir(os.path.join(workdir, d))
                and os.path.exists(os.path.join(workdir, d, "metrics.jsonl")))
  first = workdir if os.path.exists(os.path.join(workdir, "metrics.jsonl")) else (
      os.path.join(workdir, dirs[0]))
  rows = metrics_log.read(first)
  rates = [r["perf/steps_per_sec"] for r in rows if "perf/steps_per_sec" in r]
  with open(os.path.join(first, "train_done.json")) as f:
    step = json.load(f)["step"]
  return {"wall_clock_s": round(wall, 2), "steps": step,
          "steps_per_s": statistics.median(rates) if rates else None,
          "command": cmd[1:]}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/g2p.py:fast")
  parser.add_argument("--members", type=int, default=8, help="N of train.members=seeds:N")
  parser.add_argument("--out", required=True, help="a fresh directory for the two workdirs")
  args, extra = parser.parse_known_args()
  bad = [e for e in extra if not e.startswith("--config.")]
  if bad:
    parser.error(f"unknown arguments {bad} (only --config.* flags pass on to train.py)")
  if args.members < 2:
    parser.error(f"--members={args.members} must be >= 2")
  for name in ("one", "many"):
    if os.path.exists(os.path.join(args.out, name)):
      parser.error(f"--out={args.out} already holds {name}/; use a fresh directory")
  os.makedirs(args.out, exist_ok=True)
  one = timed_train(args.config, os.path.join(args.out, "one"), extra)
  many = timed_train(args.config, os.path.join(args.out, "many"),
                     extra + [f"--config.train.members=seeds:{args.members}"])
  import jax  # pylint: disable=g-import-not-at-top  (only to name the device)
  record = {"config": args.config, "extra": extra, "members": args.members,
            "device": jax.devices()[0].device_kind, "one": one, "many": many,
            "wall_clock_ratio": many["wall_clock_s"] / one["wall_clock_s"],
            "steps_per_s_ratio": (many["steps_per_s"] / one["steps_per_s"]
                                  if one["steps_per_s"] and many["steps_per_s"] else None)}
  print(f"1 run: {one['wall_clock_s']:.1f} s; {args.members} members in one program: "
        f"{many['wall_clock_s']:.1f} s = {record['wall_clock_ratio']:.2f}x on "
        f"{record['device']}")
  print(json.dumps(record))


if __name__ == "__main__":
  main()
