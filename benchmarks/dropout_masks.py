"""What a train step's dropout masks cost: model.dropout_bits=8 against 32 (Flax's nn.Dropout).

  python benchmarks/dropout_masks.py                      # :fast's 17 sites of [128, 32, 128]
  python benchmarks/dropout_masks.py --sites=7 --shape=64,32,64 --rounds=9

Times, jitted and alternating `--rounds` times in one process (a busy machine slows all alike),
layers.dropout over one [sites, *shape] float32 array (the residual and embedding dropout of
configs/g2p.py:fast: 3 encoder layers x 2 + 3 decoder layers x 3 + 2 embeddings = 17 sites of
128 rows x 32 positions x d 128) with a fresh key per call, at 8 and 32 bits, and, as the floor,
the same array only scaled (what is left of dropout without random numbers). Prints each one's
fastest median in ms and the ratios.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position

from transformer import layers  # pylint: disable=g-import-not-at-top,wrong-import-position


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sites", type=int, default=17)
  parser.add_argument("--shape", default="128,32,128", help="one site's shape")
  parser.add_argument("--rate", type=float, default=0.1)
  parser.add_argument("--calls", type=int, default=5, help="calls per timing")
  parser.add_argument("--rounds", type=int, default=5)
  args = parser.parse_args(argv)
  x = jnp.ones((args.sites, *map(int, args.shape.split(","))), jnp.float32)
  scale = 1.0 / (1.0 - args.rate)
  fns = {
      "32 bits": jax.jit(lambda key, x: layers.dropout(x, args.rate, key, bits=32)),
      "8 bits": jax.jit(lambda key, x: layers.dropout(x, args.rate, key, bits=8)),
      "scale only": jax.jit(lambda key, x: x * scale),
  }
  key = jax.random.key(0)
  for fn in fns.values():
    fn(key, x).block_until_ready()
  best = {name: float("inf") for name in fns}
  for _ in range(args.rounds):
    for name, fn in fns.items():
      times = []
      for i in range(args.calls):
        start = time.perf_counter()
        fn(jax.random.fold_in(key, i), x).block_until_ready()
        times.append((time.perf_counter() - start) * 1e3)
      best[name] = min(best[name], statistics.median(times))
  print(f"{args.sites} sites x {args.shape} = {x.size / 1e6:.1f}M elements, rate {args.rate}, "
        f"{jax.devices()[0].platform}")
  for name, ms in best.items():
    print(f"  {name:>10}: {ms:7.1f} ms")
  floor = best["scale only"]
  print(f"  8 bits / 32 bits: {best['8 bits'] / best['32 bits']:.2f}; above the floor: "
        f"{(best['8 bits'] - floor) / (best['32 bits'] - floor):.2f}")


if __name__ == "__main__":
  main()
