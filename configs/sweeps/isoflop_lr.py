r"""The learning-rate scan behind configs/lm.py:isoflop: 5 shapes from 12k to 83k non-embedding
parameters (the range of isoflop.py's budgets), each trained on 5e10 FLOPs (isoflop.py's second
budget) at 4 learning rates, and the smallest and largest also at 1.6e-2 to bracket the best
(seed 0); the members of a shape train as one packed program.

  python sweep.py --config=configs/lm.py:isoflop --sweep=configs/sweeps/isoflop_lr.py \
      --workdir=runs/isoflop_lr --pack=4 --eval_split= \
      --config.data.dataset=text_files --config.data.text_file=../shared/data/tinyshakespeare.txt
"""

from configs.sweeps import isoflop
from transformer.scaling import isoflop as isoflop_lib

LEARNING_RATES = (1e-3, 2e-3, 4e-3, 8e-3)
BRACKET = 1.6e-2  # also at the first and last shape
BUDGET = 5e10
SHAPES = ((32, 1), (24, 2), (32, 2), (40, 3), (48, 3))  # (d_model, layers); heads of 8, mlp 4 d


def get_sweep(config):
  """The budget's sizes x learning rates."""
  vocab = config.model.vocab_size or isoflop.VOCAB_SIZE
  runs = [isoflop_lib.run_for(config, BUDGET, isoflop_lib.Shape(d, layers, d // 8, 4 * d),
                              vocab_size=vocab) for d, layers in SHAPES]
  points = isoflop_lib.sweep_points(config, runs, [0])
  return [{**point, "train.learning_rate": lr} for i, point in enumerate(points)
          for lr in LEARNING_RATES + ((BRACKET,) if i in (0, len(points) - 1) else ())]
