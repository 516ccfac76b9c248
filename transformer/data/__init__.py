"""The data layer: TFDS builders read through Grain, tokenizers, and the pipelines
(`load_task(cfg, workdir).train_iterator()` gives packed numpy batches, see pipeline.py). Imported
lazily, so that reading the tokenizers' table (config validation) does not load TFDS.
"""

import importlib

_EXPORTS = {"Task": "task", "load_task": "task", "Tokenizer": "tokenizers"}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(f"transformer.data.{_EXPORTS[name]}"), name)
  raise AttributeError(f"module 'transformer.data' has no attribute {name!r}")
