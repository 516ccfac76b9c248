"""Every component table, loaded: importing this module imports each module that registers a
table of allowed values with the schema (`transformer.schema.registry`: model.ffn's FEED_FORWARDS,
train.optimizer's OPTIMIZERS, ...), so that every REGISTERED key knows its names. It sits at the
top of the house and may import every part; nothing in the library imports it.

`python -m transformer.components > docs/config.md` writes the key reference (checked by a test).
"""

from transformer import schema
from transformer.data import tokenizers
from transformer.infer import decoding
from transformer.model import attention, kernels, layers, positional
from transformer.train import optim, scheduled_sampling

# The modules holding a registered table (a new table's module is added here).
MODULES = (kernels, attention, layers, positional, tokenizers, decoding, optim, scheduled_sampling)


def unregistered() -> list[str]:
  """The REGISTERED keys whose table no module in MODULES registered (empty when all are)."""
  return [k.name for k in schema.SCHEMA
          if isinstance(k.allowed, schema.Registered) and schema.registered(k.name) is None]


def markdown() -> str:
  """docs/config.md: the schema's key reference, each REGISTERED key with its table's names."""
  if missing := unregistered():
    raise RuntimeError(f"no table registered for {', '.join(missing)}")
  return schema.markdown()


if __name__ == "__main__":
  print(markdown(), end="")
