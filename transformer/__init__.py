"""A JAX/Flax transformer research library: build, train, decode and inspect transformers.

The public API (the names in _EXPORTS) is imported lazily, so that `import transformer.model.models`
never pulls in data, training or I/O code."""

import importlib

_EXPORTS = {
    "transformer.config": ("model_config", "from_configdict", "ConfigError"),
    "transformer.model.models": ("build_model",),
    "transformer.data": ("load_task",),
    "transformer.infer.decoding": ("generate",),
    "transformer.train.loop": ("train_and_evaluate",),
    "transformer.infer.evaluation": ("evaluate_split",),
    "transformer.infer.api": ("restore", "Run", "Attention", "image_attention_map"),
    "transformer.run.compare": ("compare", "Comparison"),
    "transformer.scaling.fits": ("fit_runs",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name):
  if name in _MODULE_OF:
    return getattr(importlib.import_module(_MODULE_OF[name]), name)
  raise AttributeError(f"module 'transformer' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + __all__)
