"""Positional encodings: the paper's sinusoids vs learned, RoPE, T5 relative bias, ALiBi and none.

  python sweep.py --config=configs/g2p.py:small --sweep=configs/sweeps/positional.py \
      --workdir=runs/sweep_positional
"""

from configs.sweeps import sweep


def get_sweep():
  """Six runs, one per `model.positional`."""
  return sweep("model.positional", ["sinusoidal", "learned", "rope", "relative", "alibi", "none"])
