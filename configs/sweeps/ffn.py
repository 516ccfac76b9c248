"""Feed-forward activations: ReLU (the paper), GELU, SwiGLU, GeGLU at matched parameter count.

A gated FFN has three matrices instead of two, so its hidden size is 2/3 of the config's
`model.mlp_dim` (rounded to a multiple of 8), as in Shazeer (2020), "GLU Variants Improve
Transformer".

  python sweep.py --config=configs/g2p.py:small --sweep=configs/sweeps/ffn.py --workdir=runs/sweep_ffn
"""

from configs.sweeps import chain, sweep


def get_sweep(config):
  """Four runs, one per `model.ffn`; the gated ones with mlp_dim * 2/3."""
  gated_dim = max(8, round(config.model.mlp_dim * 2 / 3 / 8) * 8)
  return chain(sweep("model.ffn", ["relu", "gelu"]),
               [{"model.ffn": ffn, "model.mlp_dim": gated_dim} for ffn in ("swiglu", "geglu")])
