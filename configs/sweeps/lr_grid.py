"""Learning rate on a factor-of-2 grid around the config's own (1/8x .. 8x), 2 seeds: the sweep
that tunes a µP model's rate at its base width (docs/mup.md), as one members program with --pack.

  python sweep.py --config=configs/lm.py:nanogpt_cpu --sweep=configs/sweeps/lr_grid.py \
      --workdir=runs/lr_grid --pack=14 --config.model.parametrization=mup \
      --config.model.mup_base_width=128 --config.data.dataset=text_files \
      --config.data.text_file=/path/to/tinyshakespeare.txt
"""

from configs.sweeps import product, sweep


def get_sweep(config):
  """Fourteen runs: seven learning rates lr * 2**k, k = -3..3, x seeds 0 and 1."""
  lr = config.train.learning_rate
  return product(sweep("train.learning_rate", [lr * 2.0**k for k in range(-3, 4)]),
                 sweep("seed", [0, 1]))
