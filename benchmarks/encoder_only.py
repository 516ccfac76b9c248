r"""The README's encoder-only table and plot from the runs' `metrics.test.json` files.

  python benchmarks/encoder_only.py --runs=RUNS_DIR --out=docs/results/encoder_only

RUNS_DIR holds `scratch_<fraction>` and `pretrained_<fraction>` workdirs (configs/classify.py
trained with --config.data.label_fraction=<fraction>, the latter with --init_from, each evaluated
with `eval.py --split=test --step=best`); the optional `pretrained3000_<fraction>` rows come from a
3000-step masked LM. Writes table.md, results.json and label_efficiency.png under --out.
"""

import glob
import json
import os
import re

from absl import app, flags

from transformer import viz

FLAGS = flags.DEFINE_string("runs", None, "directory of the runs", required=True)
OUT = flags.DEFINE_string("out", "docs/results/encoder_only", "output directory")
NAMES = {"scratch": "from scratch", "pretrained": "from the MLM checkpoint (1000 steps)",
         "pretrained3000": "from the MLM checkpoint (3000 steps)"}
MAJORITY = 0.7243  # class '1' among the 12,523 test words (data.label=primary_stress)


def main(argv):
  del argv
  results: dict[str, dict[float, dict]] = {}
  for path in sorted(glob.glob(os.path.join(FLAGS.value, "*_*", "metrics.test.json"))):
    match = re.fullmatch(r"(scratch|pretrained|pretrained3000)_([0-9.]+)",
                         os.path.basename(os.path.dirname(path)))
    if match:
      with open(path) as f:
        results.setdefault(match[1], {})[float(match[2])] = json.load(f)
  fractions = sorted({f for runs in results.values() for f in runs})
  lines = ["| initialisation | " + " | ".join(f"{100 * f:g}% labels" for f in fractions) + " |",
           "|---|" + "---|" * len(fractions)]
  for kind, runs in results.items():
    cells = [f"{100 * runs[f]['accuracy']:.1f}% (F1 {runs[f]['f1']:.3f})" if f in runs else "-"
             for f in fractions]
    lines.append(f"| {NAMES[kind]} | " + " | ".join(cells) + " |")
  os.makedirs(OUT.value, exist_ok=True)
  with open(os.path.join(OUT.value, "table.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  with open(os.path.join(OUT.value, "results.json"), "w") as f:
    json.dump({NAMES[k]: {str(x): v for x, v in r.items()} for k, r in results.items()}, f,
              indent=1)
  viz.plot_label_efficiency({NAMES[k]: {x: v["accuracy"] for x, v in r.items()}
                             for k, r in results.items()}, baseline=MAJORITY,
                            save_path=os.path.join(OUT.value, "label_efficiency.png"))
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
