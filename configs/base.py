"""The complete default configuration; every other config starts from it.

Each key, its default and its meaning are declared once, in transformer/schema.py's SCHEMA (the
library needs them too, and configs import the library, never the reverse); docs/config.md lists
them. Defaults follow the base Transformer of Vaswani et al. (2017). This file is not a runnable
experiment; see configs/g2p.py for the offline default.
"""

import ml_collections

from transformer import schema


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the full default ConfigDict (the argument is unused)."""
  del arg
  return schema.get_config()
