r"""IsoFLOP sweep of a decoder-only LM: 4 compute budgets (2.5e10 to 2e11 training FLOPs, a factor 2
apart) x 7 model sizes x seeds 0 and 1 (transformer/scaling/isoflop.py: the shape rule, the
steps that spend each budget, warmup and decay scaled with the run).

Sizes are spaced 1.5x in non-embedding parameters, centred on N = sqrt(C / (6 x 150)), so that
each window brackets its budget's optimum (50 to 200 tokens per parameter for these character
models) and no run reads Tiny Shakespeare's training split more than 4 times. Every shape has 2
layers and 2 heads (d_model even): width is the one axis, the one µP (configs/lm.py:isoflop, base
width 16) transfers a learning rate along. docs/scaling.md's study runs it so:

  python sweep.py --config=configs/lm.py:isoflop --sweep=configs/sweeps/isoflop.py \
      --workdir=runs/isoflop --pack=2 --eval_split= \
      --config.data.dataset=text_files --config.data.text_file=../shared/data/tinyshakespeare.txt
  python -m transformer.scaling fit runs/isoflop --holdout=2e11
"""

from transformer.scaling import isoflop

BUDGETS = tuple(2.5e10 * 2 ** i for i in range(4))
LADDER = isoflop.Ladder(num_layers=2, mlp_ratio=4, num_heads=2)
SIZES = dict(num_sizes=7, spacing=1.5, tokens_per_param=150.0)
SEEDS = (0, 1)
VOCAB_SIZE = 69  # the char tokenizer of Tiny Shakespeare: 65 characters and 4 special tokens


def runs(config, budgets=BUDGETS):
  """The sweep's (budget, shape, steps) runs."""
  return isoflop.plan(config, budgets, LADDER, vocab_size=config.model.vocab_size or VOCAB_SIZE,
                      **SIZES)


def get_sweep(config):
  """Every run of every budget, once per seed."""
  return isoflop.sweep_points(config, runs(config), SEEDS)
