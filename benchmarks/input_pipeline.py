"""Input-pipeline benchmark: batches/s of the G2P training pipeline and its packing efficiency.

  python benchmarks/input_pipeline.py                      # configs/g2p.py default variant
  python benchmarks/input_pipeline.py --variant=small --data_dir=/tmp/tfds --batches=300
  python benchmarks/input_pipeline.py --variant=fast --modes=pack --compare=REV --rounds=3

Prints, per batching mode (pack, bucket, pad): batches/s and examples/s after a warm-up batch (the
one-off tokenization of the split is timed separately), and the non-padding fraction of `inputs`,
`targets` and of both together. Then it times the same config's jit-compiled training step on
packed batches in the same run and prints the ratio: the pipeline must never be the bottleneck
(>= 20x the training step rate), and packing should fill >= 90% of the token slots on G2P.

--compare=REV times the pipeline of git revision REV's tree and of this tree in fresh processes,
alternating `--rounds` times and keeping each one's fastest, and prints before -> after per mode
with the ratio, and whether the two produced the same batches (a sha256 of every array of every
timed batch): equal digests mean the same data, so the ratio is the whole story.
"""

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import time

from trees import alternate, tree_from_argv  # benchmarks/ is the script's directory

sys.path.insert(0, tree_from_argv())

from transformer.config import from_configdict  # pylint: disable=g-import-not-at-top,wrong-import-position
from transformer.data import load_task  # pylint: disable=g-import-not-at-top,wrong-import-position


def _config(variant: str, data_dir: str):
  """configs/g2p.py (variant) or, if it is missing, base.py with G2P defaults."""
  try:
    from configs import g2p  # pylint: disable=g-import-not-at-top
    cd = g2p.get_config(variant)
  except ImportError:
    from configs import base  # pylint: disable=g-import-not-at-top
    cd = base.get_config()
    cd.data.update(batch_size=128, max_source_len=32, max_target_len=32)
  if data_dir:
    cd.data.data_dir = data_dir
  return from_configdict(cd)


def run(cfg, mode: str, num_batches: int) -> dict[str, float]:
  """Times `num_batches` training batches of `mode` on one host."""
  cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, batching=mode))
  task = load_task(cfg, process_index=0, process_count=1)
  start = time.perf_counter()
  it = task.train_iterator()
  next(it)
  setup = time.perf_counter() - start
  examples = slots = real = 0
  fill = {"inputs": [0, 0], "targets": [0, 0]}
  batches = []
  start = time.perf_counter()
  for _ in range(num_batches):
    b = next(it)
    batches.append(b)
    examples += int(b["targets_segment_ids"].max(axis=1).sum())
    for name in fill:
      fill[name][0] += int((b[name] != 0).sum())
      fill[name][1] += b[name].size
  elapsed = time.perf_counter() - start
  real = sum(v[0] for v in fill.values())
  slots = sum(v[1] for v in fill.values())
  return {"setup_s": setup, "batches_per_s": num_batches / elapsed,
          "examples_per_s": examples / elapsed, "inputs_fill": fill["inputs"][0] / fill["inputs"][1],
          "targets_fill": fill["targets"][0] / fill["targets"][1], "both_fill": real / slots,
          "digest": batch_digest(batches)}


def batch_digest(batches: list[dict]) -> str:
  """sha256 of every array of every batch, in order, each with its name, dtype and shape: equal
  digests mean the same batches (a reordering, a changed value, dtype or shape changes it)."""
  digest = hashlib.sha256()
  for b in batches:
    for name in sorted(b):
      array = b[name]
      digest.update(f"{name}:{array.dtype}:{array.shape}:".encode() + array.tobytes())
  return digest.hexdigest()


def train_steps_per_s(cfg, num_steps: int) -> float:
  """Steps/s of the config's jit-compiled training step on packed batches (after compiling)."""
  import jax  # pylint: disable=g-import-not-at-top
  from transformer.train import start, steps  # pylint: disable=g-import-not-at-top
  from transformer.model.models import build_model  # pylint: disable=g-import-not-at-top
  from transformer.train.optim import make_optimizer  # pylint: disable=g-import-not-at-top
  task = load_task(cfg, process_index=0, process_count=1)
  cfg = start.fill_vocab_sizes(cfg, task)
  model, tx = build_model(cfg.model), make_optimizer(cfg.train, cfg.model.d_model)
  it = task.train_iterator()
  batches = [next(it) for _ in range(num_steps + 1)]
  state = steps.create_train_state(cfg, model, jax.random.PRNGKey(0), batches[0], tx)
  step = jax.jit(steps.make_train_step(cfg, model, tx), donate_argnums=0)
  state, metrics = step(state, batches[0])
  jax.block_until_ready(metrics)
  start = time.perf_counter()
  for b in batches[1:]:
    state, metrics = step(state, b)
  jax.block_until_ready(metrics)
  return num_steps / (time.perf_counter() - start)


def compare(args) -> None:
  """This file at REV's tree and at this tree, alternating fresh processes; fastest of each."""
  data_dir = os.path.abspath(args.data_dir) if args.data_dir else ""
  best: dict[tuple[str, str], dict] = {}
  flags = [f"--variant={args.variant}", f"--data_dir={data_dir}", f"--batches={args.batches}",
           f"--modes={args.modes}"]
  for who, _, record in alternate(os.path.abspath(__file__), [flags], args.compare, args.rounds):
    for mode, r in record.items():
      if (who, mode) not in best or r["batches_per_s"] > best[who, mode]["batches_per_s"]:
        best[who, mode] = r
  print(f"input pipeline: fastest of {args.rounds} alternating rounds of {args.batches} batches, "
        f"{args.compare} (before) vs this tree (after); load {os.getloadavg()[0]:.2f}")
  for mode in args.modes.split(","):
    b, a = best["before", mode], best["after", mode]
    same = "the same batches" if b["digest"] == a["digest"] else "DIFFERENT batches"
    print(f"  {mode:6s} {b['batches_per_s']:7.1f} -> {a['batches_per_s']:7.1f} batches/s  "
          f"{a['batches_per_s'] / b['batches_per_s']:.2f}x  ({same})")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--variant", default="", help="configs/g2p.py variant ('' = its default)")
  parser.add_argument("--data_dir", default="", help="TFDS data_dir ('' = the config's)")
  parser.add_argument("--batches", type=int, default=200)
  parser.add_argument("--modes", default="pack,bucket,pad")
  parser.add_argument("--train_steps", type=int, default=5, help="training steps timed (0 = skip)")
  parser.add_argument("--compare", default="", help="a git revision to time against")
  parser.add_argument("--rounds", type=int, default=2, help="alternating rounds for --compare")
  parser.add_argument("--tree", default="", help=argparse.SUPPRESS)  # read by trees.tree_from_argv()
  parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # for --compare
  args = parser.parse_args()
  if args.compare:
    compare(args)
    return
  cfg = _config(args.variant, args.data_dir)
  if args.json:
    print(json.dumps({mode: run(cfg, mode, args.batches) for mode in args.modes.split(",")}))
    return
  d = cfg.data
  print(f"G2P input pipeline: dataset={d.dataset} batch_size={d.batch_size} rows x "
        f"(max_source_len={d.max_source_len}, max_target_len={d.max_target_len}), "
        f"{args.batches} batches, 1 host")
  rates = {}
  for mode in args.modes.split(","):
    r = run(cfg, mode, args.batches)
    rates[mode] = r["batches_per_s"]
    print(f"  {mode:6s} {r['batches_per_s']:7.1f} batches/s  {r['examples_per_s']:9.0f} examples/s  "
          f"non-padding: inputs {r['inputs_fill']:.1%}  targets {r['targets_fill']:.1%}  "
          f"both {r['both_fill']:.1%}  (first batch incl. tokenizing the split: {r['setup_s']:.1f} s)")
  if args.train_steps and "pack" in rates:
    steps = train_steps_per_s(cfg, args.train_steps)
    print(f"  training step of this config: {steps:.2f} steps/s -> the packing pipeline is "
          f"{rates['pack'] / steps:.0f}x the training step rate (target >= 20x)")


if __name__ == "__main__":
  main()
