"""positional.py's six encodings, each with seeds 0 and 1, seed-major (all six of seed 0 first).

The seed-to-seed spread says which gaps between encodings a sweep resolves. The study of
docs/sweeps.md#positional-encodings-on-g2p runs it so (its record holds the exact command):

  python sweep.py --config=configs/g2p.py:ablate --sweep=configs/sweeps/positional_seeds.py \
      --workdir=runs/sweep_pos --config.train.num_steps=3000 --config.eval.every_steps=1000 \
      --config.checkpoint.every_steps=1000 --parallel=2
"""

from configs.sweeps import positional, product, sweep


def get_sweep():
  """Twelve runs: each `model.positional` of positional.py with seeds 0 and 1."""
  return product(sweep("seed", [0, 1]), positional.get_sweep())
