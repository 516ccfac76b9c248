"""Learning rate x warmup.

With the paper's rsqrt schedule (`train.schedule='rsqrt'`) `train.learning_rate` multiplies
d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), so the values are multipliers around 1; for the
other schedules they are peak learning rates. Warmup is 5% and 20% of `train.num_steps`.

  python sweep.py --config=configs/g2p.py:small --sweep=configs/sweeps/lr.py --workdir=runs/sweep_lr
"""

from configs.sweeps import product, sweep


def get_sweep(config):
  """Six runs: three learning rates x two warmup lengths."""
  rates = [0.5, 1.0, 2.0] if config.train.schedule == "rsqrt" else [3e-4, 1e-3, 3e-3]
  steps = config.train.num_steps
  warmups = sorted({max(1, int(steps * f)) for f in (0.05, 0.2)})
  return product(sweep("train.learning_rate", rates), sweep("train.warmup_steps", warmups))
