"""The default configuration, the one every other config starts from: the base Transformer of
Vaswani et al. (2017). Not a runnable experiment; configs/g2p.py is the offline default.

Every key, its default and its meaning are declared once, one line each, in the typed config
classes of transformer/schema.py (ModelConfig, DataConfig, TrainConfig, ...; the library needs
them too, and configs import the library, never the reverse). docs/config.md lists them in one
table and `python train.py --help_keys` prints them.
"""

import ml_collections

from transformer import schema


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the full default ConfigDict (the argument is unused)."""
  del arg
  return schema.get_config()
