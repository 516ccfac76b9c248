r"""What checksummed checkpoints cost: save and restore time with and without the digest.

  python benchmarks/checkpoint_digest.py [--repeats=2] [--out=docs/results/checkpoint_digest]

Two train states of random arrays (parameters and Adam's two moments; no training), with the
shapes that steps.create_train_state gives:
  fast   configs/g2p.py:fast's model (vocabularies of 64 ids)
  gpt2   GPT-2 small: decoder-only, 12 layers, d_model 768, 12 heads, MLP 3072, vocabulary 50304,
         1024 positions
Each is saved through checkpoints.Checkpointer (async, as training saves) and timed until the step
is committed: `save` without the digest (write_step_digest replaced by a no-op), `save+digest`
with it (hashing every file once orbax has committed). Restoring times checkpoints.Checkpointer
.restore alone (`restore`) and Checkpointer.restore_latest_good (`verify+restore`, what a resume
does: the step's files are verified while it is restored).
The files were just written, so reads come from the page cache in both arms. Median of
`--repeats` after one unmeasured save and restore; one line per size, and with --out a
record.json and the raw log (with the load average at the start: the machine may be shared).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import commands  # noqa: E402  (benchmarks/ is the script's directory)
import jax  # noqa: E402  pylint: disable=wrong-import-position
import numpy as np  # noqa: E402  pylint: disable=wrong-import-position

from configs import base, g2p  # noqa: E402  pylint: disable=wrong-import-position
from transformer.config import from_configdict  # noqa: E402  pylint: disable=wrong-import-position
from transformer.model import models  # noqa: E402  pylint: disable=wrong-import-position
from transformer.run import checkpoints, digests
from transformer.train import optim, steps

GPT2_SMALL = {"model.arch": "decoder_only", "model.num_decoder_layers": 12, "model.d_model": 768,
              "model.num_heads": 12, "model.mlp_dim": 3072, "model.vocab_size": 50304,
              "model.max_len": 1024, "model.positional": "learned"}


def _config(name: str):
  cd = g2p.get_config("fast") if name == "fast" else base.get_config()
  overrides = ({"model.vocab_size": 64, "model.source_vocab_size": 64} if name == "fast"
               else GPT2_SMALL)
  for key, value in overrides.items():
    cd.update_from_flattened_dict({key: value})
  return from_configdict(cd)


def random_state(name: str):
  """A train state of `name`'s shapes filled with random float32 (int leaves zero)."""
  cfg = _config(name)
  model = models.build_model(cfg.model)
  tx = optim.make_optimizer(cfg.train, cfg.model)
  shapes = jax.eval_shape(lambda: steps.create_train_state(
      cfg, model, jax.random.key(0), models.example_batch(cfg.model, 2), tx))
  rng = np.random.default_rng(0)

  def fill(x):
    if np.issubdtype(x.dtype, np.floating):
      return jax.numpy.asarray(rng.standard_normal(x.shape, np.float32).astype(x.dtype))
    return jax.numpy.zeros(x.shape, x.dtype)
  state = jax.tree.map(fill, shapes)
  size = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
  return cfg, state, size


def _timed(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def measure(name: str, repeats: int, root: str) -> dict[str, float]:
  cfg, state, size = random_state(name)
  abstract = checkpoints.abstract_of(state)
  real_digest = digests.write_step_digest
  times: dict[str, list[float]] = {k: [] for k in
                                   ("save", "save_digest", "restore", "verify_restore")}
  warm = checkpoints.Checkpointer(os.path.join(root, f"{name}_warmup"), cfg.checkpoint)
  warm.save(1, state, force=True)  # first use: orbax's and tensorstore's one-time costs
  jax.block_until_ready(warm.restore(1, abstract))
  warm.close()
  for r in range(repeats):
    for digest in (False, True):
      workdir = os.path.join(root, f"{name}_{r}_{int(digest)}")
      digests.write_step_digest = real_digest if digest else (lambda _: None)
      ckpt = checkpoints.Checkpointer(workdir, cfg.checkpoint)
      try:
        times["save_digest" if digest else "save"].append(
            _timed(lambda: (ckpt.save(1, state, force=True), ckpt.wait())))
        step_dir = os.path.join(ckpt.directory, "1")
        if digest:
          assert digests.verify_step(step_dir) is None
          times["verify_restore"].append(_timed(lambda: jax.block_until_ready(
              ckpt.restore_latest_good(abstract)[1])))
        else:
          times["restore"].append(_timed(lambda: jax.block_until_ready(ckpt.restore(1, abstract))))
      finally:
        ckpt.close()
        digests.write_step_digest = real_digest
        shutil.rmtree(workdir, ignore_errors=True)
  out = {f"{name}_state_mb": round(size / 1e6, 1)}
  out |= {f"{name}_{k}_s": round(statistics.median(v), 3) for k, v in times.items()}
  out[f"{name}_save_overhead_pct"] = round(
      100 * (out[f"{name}_save_digest_s"] / out[f"{name}_save_s"] - 1), 1)
  out[f"{name}_restore_overhead_pct"] = round(
      100 * (out[f"{name}_verify_restore_s"] / out[f"{name}_restore_s"] - 1), 1)
  return out




def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--sizes", default="fast,gpt2")
  parser.add_argument("--out", default="", help="write record.json and log.txt here")
  args = parser.parse_args(argv)
  started, load = time.time(), os.getloadavg()
  metrics: dict[str, float] = {}
  lines = []
  root = tempfile.mkdtemp(prefix="checkpoint_digest_")
  try:
    for name in args.sizes.split(","):
      m = measure(name, args.repeats, root)
      metrics |= m
      lines.append(
          f"{name}: state {m[f'{name}_state_mb']} MB; save {m[f'{name}_save_s']:.3f} s, "
          f"save+digest {m[f'{name}_save_digest_s']:.3f} s "
          f"({m[f'{name}_save_overhead_pct']:+.1f}%); restore {m[f'{name}_restore_s']:.3f} s, "
          f"verify+restore {m[f'{name}_verify_restore_s']:.3f} s "
          f"({m[f'{name}_restore_overhead_pct']:+.1f}%); median of {args.repeats}")
      print(lines[-1], flush=True)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  wall = round(time.time() - started, 1)
  if args.out:
    command = commands.command_line("checkpoint_digest.py",
                                    argv if argv is not None else sys.argv[1:])
    record = {
        "name": os.path.basename(os.path.normpath(args.out)),
        "title": "Checksummed checkpoints: save and restore time with and without the digest",
        "task": "checkpoint save/restore of random train states (:fast and GPT-2 small sized)",
        "config": "configs/g2p.py:fast", "overrides": [], "command": command,
        "commit": commands.git_commit(), "hardware": commands.cpu_hardware(),
        "versions": commands.versions("jax", "orbax-checkpoint", "numpy"),
        "wall_clock_s": wall, "rates": {}, "metrics": metrics, "seeds": [],
        "report": "docs/reliability.md#checksummed-checkpoints"}
    commands.write_record(args.out, record, f"$ {command}\n" + "\n".join(lines) + f"\nwall "
                          f"{wall} s; load average at the start {load[0]:.2f} (1 min)\n")
  return 0




if __name__ == "__main__":
  sys.exit(main())
