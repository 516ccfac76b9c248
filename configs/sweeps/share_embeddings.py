"""One embedding table for letters and phones (shared) vs one per side (separate).

With char sources and symbol targets both numbered from 4, a shared table makes letter i and phone
i the same vector: a modelling accident rather than a choice (the paper shares because its BPE
vocabulary is shared). The measured result:
docs/sweeps.md#sharing-letter-and-phone-embeddings-on-g2p.

  python sweep.py --config=configs/g2p.py:ablate --sweep=configs/sweeps/share_embeddings.py \
    --workdir=runs/sweep_share
"""

from configs.sweeps import product, sweep


def get_sweep():
  """Four runs: model.share_src_tgt_embeddings True and False, two seeds each (the spread)."""
  return product(sweep("model.share_src_tgt_embeddings", [True, False]), sweep("seed", [0, 1]))
