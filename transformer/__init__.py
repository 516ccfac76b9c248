"""A JAX/Flax transformer research library: build, train, decode and inspect transformers.

The public API, imported lazily so that `import transformer.models` never pulls in data, training
or I/O code:

  model_config(**overrides), from_configdict(cd), ConfigError    transformer.config
  build_model(model_config)                                      transformer.models
  load_task(config, workdir=None)                                transformer.data
  generate(model, params, batch, decode_cfg, ...) -> token ids   transformer.decoding
  train_and_evaluate(configdict, workdir)                        transformer.training
  evaluate_split(workdir, split='test', step=None, params='auto', average_last=0)
                                                                 transformer.evaluation
  restore(workdir, step=None, params='auto', average_last=0) -> Run (.generate_text/.score/
    .attention)                                                  transformer.api
`evaluate` is the deprecated name of `evaluate_split`, kept for existing callers.
"""

import importlib
import warnings

_EXPORTS = {
    "model_config": "transformer.config",
    "from_configdict": "transformer.config",
    "ConfigError": "transformer.config",
    "build_model": "transformer.models",
    "load_task": "transformer.data",
    "generate": "transformer.decoding",
    "train_and_evaluate": "transformer.training",
    "evaluate_split": "transformer.evaluation",
    "restore": "transformer.api",
    "Run": "transformer.api",
    "Attention": "transformer.api",
}
_DEPRECATED = {"evaluate": "evaluate_split"}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _DEPRECATED:
    warnings.warn(f"transformer.{name} is deprecated: use transformer.{_DEPRECATED[name]}",
                  DeprecationWarning, stacklevel=2)
    name = _DEPRECATED[name]
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f"module 'transformer' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + __all__)
