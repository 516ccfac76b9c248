"""The EMA of the parameters (train.ema_decay): off, 0.99 and 0.999 (3 runs).

Evaluation uses the EMA of the runs that keep one (eval.py --params=raw for the raw parameters of
the same run). Keep a few checkpoints to also compare checkpoint averaging on the same runs
(eval.py --average_last=N afterwards):

  python sweep.py --config=configs/g2p.py:tiny --sweep=configs/sweeps/ema.py --workdir=runs/sweep_ema \
    --config.checkpoint.keep=5
"""

from configs.sweeps import sweep


def get_sweep():
  """Three runs: train.ema_decay 0 (off), 0.99 and 0.999."""
  return sweep("train.ema_decay", [0.0, 0.99, 0.999])
