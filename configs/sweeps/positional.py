"""Positional encodings: the paper's sinusoids vs learned, RoPE, T5 relative bias, ALiBi and none.

Two seeds per encoding, seed-major (all six of seed 0 first), so that the seed-to-seed spread says
which gaps the sweep resolves. The README's table ("Positional encodings on G2P") came from:

  python sweep.py --config=configs/g2p.py:tiny --sweep=configs/sweeps/positional.py \
      --workdir=runs/sweep_pos --config.train.num_steps=3000 --config.eval.every_steps=1000 \
      --config.checkpoint.every_steps=1000 --parallel=2
"""

from configs.sweeps import product, sweep


def get_sweep():
  """Twelve runs: each `model.positional` with seeds 0 and 1."""
  return product(sweep("seed", [0, 1]), sweep(
      "model.positional", ["sinusoidal", "learned", "rope", "relative", "alibi", "none"]))
