"""Random search: 8 points of learning rate (log-uniform), warmup and label smoothing, seed 0.

With `--early_stop=asha` the worse points stop at the first evaluations (docs/sweeps.md):

  python sweep.py --config=configs/g2p.py:tiny --sweep=configs/sweeps/random_lr.py \
      --workdir=runs/sweep_random --early_stop=asha --parallel=2
"""

from configs.sweeps import log_uniform, random_search, int_uniform, uniform


def get_sweep(config):
  """Eight runs drawn from ranges around the config's own values."""
  lr = config.train.learning_rate
  steps = config.train.num_steps
  return random_search({"train.learning_rate": log_uniform(lr / 4, lr * 4),
                        "train.warmup_steps": int_uniform(max(1, steps // 20), max(2, steps // 5)),
                        "train.label_smoothing": uniform(0.0, 0.2)}, num_points=8, seed=0)
