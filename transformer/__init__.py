"""A JAX/Flax transformer research library: build, train, decode and inspect transformers.

The public API, imported lazily so that `import transformer.model.models` never pulls in data, training
or I/O code:

  model_config(**overrides), from_configdict(cd), ConfigError    transformer.config
  build_model(model_config)                                      transformer.model.models
  load_task(config, workdir=None)                                transformer.data
  generate(model, params, batch, decode_cfg, ...) -> token ids   transformer.infer.decoding
  train_and_evaluate(configdict, workdir)                        transformer.train.loop
  evaluate_split(workdir, split='test', step=None, params='auto', average_last=0)
                                                                 transformer.infer.evaluation
  restore(workdir, step=None, params='auto', average_last=0) -> Run (.generate_text/.score/
    .attention)                                                  transformer.infer.api
"""

import importlib

_EXPORTS = {
    "model_config": "transformer.config",
    "from_configdict": "transformer.config",
    "ConfigError": "transformer.config",
    "build_model": "transformer.model.models",
    "load_task": "transformer.data",
    "generate": "transformer.infer.decoding",
    "train_and_evaluate": "transformer.train.loop",
    "evaluate_split": "transformer.infer.evaluation",
    "restore": "transformer.infer.api",
    "Run": "transformer.infer.api",
    "Attention": "transformer.infer.api",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f"module 'transformer' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + __all__)
