r"""The learning-rate scan behind configs/lm.py:isoflop: isoflop.py's 5 sizes of its smallest
budget, each at 4 learning rates (seed 0); the members of a size train as one packed program.

  python sweep.py --config=configs/lm.py:isoflop --sweep=configs/sweeps/isoflop_lr.py \
      --workdir=runs/isoflop_lr --pack=4 --eval_split= \
      --config.data.dataset=text_files --config.data.text_file=../shared/data/tinyshakespeare.txt
"""

from configs.sweeps import isoflop
from transformer.scaling import isoflop as isoflop_lib

LEARNING_RATES = (1e-3, 2e-3, 4e-3, 8e-3)


def get_sweep(config):
  """Smallest budget x sizes x learning rates."""
  runs = isoflop.runs(config, isoflop.BUDGETS[:1])
  return [{**point, "train.learning_rate": lr} for point in isoflop_lib.sweep_points(config, runs, [0])
          for lr in LEARNING_RATES]
