r"""The learning-rate scan behind configs/lm.py:isoflop: the smallest budget of isoflop.py
(2.5e10 FLOPs) at its smallest, middle and largest size (d_model 8, 14 and 28 at 2 layers), each
at 5 learning rates a factor 2 apart (seed 0). Under µP (configs/lm.py:isoflop) the best rate
should not move with width; the rate of least mean regret is the study's for every size and
budget. The rates of a shape train as members of one packed program.

  python sweep.py --config=configs/lm.py:isoflop --sweep=configs/sweeps/isoflop_lr.py \
      --workdir=runs/isoflop_lr --pack=5 --eval_split= \
      --config.data.dataset=text_files --config.data.text_file=../shared/data/tinyshakespeare.txt
"""

from configs.sweeps import isoflop
from transformer.scaling import isoflop as isoflop_lib

LEARNING_RATES = (4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2)
BUDGET = isoflop.BUDGETS[0]


def get_sweep(config):
  """The budget's smallest, middle and largest sizes x learning rates."""
  runs = isoflop.runs(config, [BUDGET])
  runs = [runs[0], runs[len(runs) // 2], runs[-1]]
  points = isoflop_lib.sweep_points(config, runs, [0])
  return [{**point, "train.learning_rate": lr} for point in points for lr in LEARNING_RATES]
