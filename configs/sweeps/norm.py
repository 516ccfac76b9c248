"""Normalisation: post-LN (the paper), pre-LN, and pre-RMSNorm.

  python sweep.py --config=configs/g2p.py:small --sweep=configs/sweeps/norm.py --workdir=runs/sweep_norm
"""

from configs.sweeps import sweep, zip  # pylint: disable=redefined-builtin


def get_sweep():
  """Three runs: post + LayerNorm, pre + LayerNorm, pre + RMSNorm."""
  return zip(sweep("model.norm_position", ["post", "pre", "pre"]),
             sweep("model.norm", ["layernorm", "layernorm", "rmsnorm"]))
