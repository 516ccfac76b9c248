"""Feed-forward activations: ReLU (the paper), GELU, SwiGLU, GeGLU at matched parameter count.

A gated FFN has three matrices instead of two, so its hidden size is 2/3 of the config's
`model.mlp_dim` (rounded to a multiple of 8), as in Shazeer (2020), "GLU Variants Improve
Transformer".

  python sweep.py --config=configs/g2p.py:small --sweep=configs/sweeps/ffn.py --workdir=runs/sweep_ffn
"""

from configs.sweeps import sweep
from transformer import choices


def get_sweep(config):
  """Four runs, one per `model.ffn`; the gated ones (choices.FFNS) with mlp_dim * 2/3."""
  gated_dim = max(8, round(config.model.mlp_dim * 2 / 3 / 8) * 8)
  return [p | ({"model.mlp_dim": gated_dim} if choices.FFNS[p["model.ffn"]].gated else {})
          for p in sweep("model.ffn", ["relu", "gelu", "swiglu", "geglu"])]
