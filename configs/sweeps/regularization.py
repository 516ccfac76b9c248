"""Regularisation: label smoothing 0 / 0.1 x dropout 0 / 0.1 x scheduled sampling off / on.

Scheduled sampling "on" is the linear schedule of Mihaylova & Martins (2019) going from always
feeding the gold token (teacher-forcing probability 1) to 0.5 at the last step.

  python sweep.py --config=configs/g2p.py:small --sweep=configs/sweeps/regularization.py \
      --workdir=runs/sweep_regularization
"""

from configs.sweeps import product, sweep


def get_sweep(config):
  """Eight runs: every combination of the three switches."""
  steps = config.train.num_steps
  scheduled_sampling = [
      {"train.scheduled_sampling.schedule": "none"},
      {"train.scheduled_sampling.schedule": "linear", "train.scheduled_sampling.k": 1.0,
       "train.scheduled_sampling.c": 0.5 / steps,
       "train.scheduled_sampling.min_teacher_forcing": 0.5}]
  return product(sweep("train.label_smoothing", [0.0, 0.1]),
                 sweep("model.dropout_rate", [0.0, 0.1]),
                 scheduled_sampling)
