"""The complete default configuration; every other config starts from it.

The defaults, one comment per key, are in transformer/defaults.py (the library needs them too, and
configs import the library, never the reverse). Defaults follow the base Transformer of Vaswani et
al. (2017): post-LN, sinusoidal positions, ReLU feed-forward, dropout 0.1, label smoothing 0.1, tied
embeddings, Adam(0.9, 0.98, 1e-9) with the "Noam" rsqrt schedule and 4000 warmup steps. Every
modern variant is one override away, e.g.
`--config.model.norm_position=pre --config.model.positional=rope --config.model.ffn=swiglu`.

This file is not a runnable experiment; see configs/g2p.py for the offline default.
"""

import ml_collections

from transformer import defaults


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the full default ConfigDict (the argument is unused)."""
  del arg
  return defaults.get_config()
