r"""The coordinate check (transformer/train/coord_check.py) of the standard parametrization and of
µP over a ladder of widths: every layer's mean |output| over the first Adam steps, the ratio of
the widest width's value to the narrowest's at the last step, and a plot (docs/mup.md).

  flock /tmp/heavy.lock python benchmarks/mup_coord_check.py \
      --text_file=/path/to/tinyshakespeare.txt    # docs/results/mup_coord_check/record.json + .png
  python benchmarks/mup_coord_check.py --out=/tmp/cc --smoke --text_file=...   # 2 small widths

The batch is the text's first batch_size rows of `length` characters (ids by first appearance,
0 kept for padding); the same batch every step, as the check asks only how the sizes scale.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

import commands  # benchmarks/ is the script's directory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # this checkout's library, not an installed one
from transformer.train import coord_check  # pylint: disable=g-import-not-at-top,wrong-import-position
RESULTS = os.path.join(REPO, "docs", "results", "mup_coord_check")
PARAMETRIZATIONS = ("standard", "mup")


def text_batch(path: str, batch_size: int, length: int) -> tuple[dict[str, np.ndarray], int]:
  """(the first batch_size x length characters of the file as ids from 1, the vocabulary size)."""
  with open(path, encoding="utf-8") as f:
    text = f.read(batch_size * length * 4)
  chars = sorted(set(text))
  ids = np.asarray([chars.index(c) + 1 for c in text[:batch_size * length]], np.int32)
  return {"targets": ids.reshape(batch_size, length)}, len(chars) + 1


def plot(results: dict[str, dict], widths: list[int], step: int, path: str) -> None:
  """Mean |output| at `step` against width, one line per layer, one panel per parametrization."""
  from transformer.infer.viz import plt  # pylint: disable=g-import-not-at-top  (Agg; plots only)
  fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), sharey=True)
  for ax, (name, result) in zip(axes, results.items()):
    for layer in result["curves"][widths[0]]:
      ax.plot(widths, [result["curves"][w][layer][step] for w in widths], marker="o",
              label=layer)
    ax.set(xscale="log", yscale="log", xlabel="d_model", title=f"{name}, after {step} Adam steps")
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("mean |output|")
  axes[-1].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--text_file", required=True)
  parser.add_argument("--out", default=RESULTS)
  parser.add_argument("--widths", default="64,128,256,512,1024")
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--seeds", type=int, default=2)
  parser.add_argument("--learning_rate", type=float, default=2**-8)
  parser.add_argument("--smoke", action="store_true", help="widths 32,64, 2 steps, 1 seed")
  args = parser.parse_args()
  widths = [int(w) for w in args.widths.split(",")]
  num_steps, seeds = args.steps, list(range(args.seeds))
  if args.smoke:
    widths, num_steps, seeds = [32, 64], 2, [0]
  batch, vocab = text_batch(args.text_file, 4, 32)
  started = time.time()
  results = {p: coord_check.check(widths, p, batch, num_steps=num_steps, seeds=seeds,
                                  vocab_size=vocab, learning_rate=args.learning_rate)
             for p in PARAMETRIZATIONS}
  write_record(results, widths, num_steps, seeds, args, time.time() - started)


def flat_metrics(results: dict[str, dict]) -> dict[str, float]:
  """Per parametrization: the largest widest/narrowest ratio, the logits', and every layer's."""
  metrics = {}
  for p, result in results.items():
    ratios = {k: round(v, 3) for k, v in result["ratios"].items()}
    metrics[f"{p}_max_ratio"] = max(ratios.values())
    metrics[f"{p}_logits_ratio"] = ratios["logits"]
    metrics.update({f"{p}_ratio_{k.replace('/', '_')}": v for k, v in ratios.items()})
  return metrics


def write_record(results: dict[str, dict], widths: list[int], num_steps: int, seeds: list[int],
                 args: argparse.Namespace, wall: float) -> None:
  """record.json, curves.json (every layer's mean |output| per step, the raw outputs) and the
  plot, in --out."""
  import jax  # pylint: disable=g-import-not-at-top  (only to name the versions)
  for p in results:
    print(p, json.dumps({k: round(v, 3) for k, v in results[p]["ratios"].items()}), flush=True)
  record = {
      "name": "mup_coord_check",
      "title": f"coordinate check, d_model {widths[0]}..{widths[-1]}, {num_steps} Adam steps at "
               f"lr {args.learning_rate:g}, standard vs µP",
      "task": "Character LM (tiny Shakespeare), one batch of 4 x 32 characters",
      "config": "transformer/train/coord_check.py:small_config",
      "overrides": [f"--widths={','.join(map(str, widths))}", f"--steps={num_steps}",
                    f"--learning_rate={args.learning_rate:g}"],
      "command": "python benchmarks/mup_coord_check.py " + " ".join(sys.argv[1:]),
      "commit": commands.git_commit(), "hardware": f"{os.cpu_count()}-core {platform.machine()} CPU",
      "versions": {"jax": jax.__version__}, "wall_clock_s": round(wall, 1), "rates": {},
      "metrics": flat_metrics(results), "seeds": seeds, "report": "docs/mup.md#coordinate-check"}
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "record.json"), "w") as f:
    json.dump(record, f, indent=1)
  curves = {p: {str(w): {k: [round(x, 5) for x in v] for k, v in r["curves"][w].items()}
                for w in widths} for p, r in results.items()}
  with open(os.path.join(args.out, "curves.json"), "w") as f:
    json.dump({"widths": widths, "step": num_steps, "mean_abs_output_per_step": curves}, f,
              indent=1)
  plot(results, widths, num_steps, os.path.join(args.out, "coord_check.png"))
  print(f"wrote {os.path.relpath(os.path.join(args.out, 'record.json'))}")


if __name__ == "__main__":
  main()
