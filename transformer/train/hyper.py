"""Hyper: hyperparameters a train step takes as traced arguments, apart from the config.

A plain run's step takes `Hyper()` (every field None: the config's Python values, compiled in as
constants). train.members (members.py) passes one float32 scalar per varying key, vmapped over
the members, so one program trains runs that differ in them. The optimizer, the loss and the
model read a value with `hyper.get(name, section)`: the traced one if given, else the config's.
"""

import dataclasses
from typing import Sequence

import jax
import numpy as np

from transformer import keyspec
from transformer.config import Config, ModelConfig

Scalar = float | jax.Array  # a config's Python value, or a member's traced one

# Config key -> Hyper field: the keys a member may trace.
FIELDS = {"train.learning_rate": "learning_rate", "train.label_smoothing": "label_smoothing",
          "model.dropout_rate": "dropout_rate",
          "model.attention_dropout_rate": "attention_dropout_rate",
          "model.ffn_dropout_rate": "ffn_dropout_rate", "train.weight_decay": "weight_decay",
          "train.warmup_steps": "warmup_steps", "train.b1": "b1", "train.b2": "b2",
          "train.z_loss": "z_loss", "train.grad_clip": "grad_clip"}
MODEL_FIELDS = tuple(f for k, f in FIELDS.items() if k.startswith("model."))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Hyper:
  """Traced hyperparameters (float32 arrays; None = the config's value); a pytree of its arrays."""
  learning_rate: jax.Array | None = None
  warmup_steps: jax.Array | None = None
  weight_decay: jax.Array | None = None
  grad_clip: jax.Array | None = None
  b1: jax.Array | None = None
  b2: jax.Array | None = None
  label_smoothing: jax.Array | None = None
  z_loss: jax.Array | None = None
  dropout_rate: jax.Array | None = None
  attention_dropout_rate: jax.Array | None = None
  ffn_dropout_rate: jax.Array | None = None

  def get(self, name: str, section: object) -> Scalar:
    """The traced value of `name`, else the config section's (e.g. cfg.train's)."""
    value = getattr(self, name)
    return getattr(section, name) if value is None else value

  @property
  def traced(self) -> bool:
    """True when any value is traced (the step then builds its optimizer from them)."""
    return any(getattr(self, f) is not None for f in FIELDS.values())

  def model_config(self, m: ModelConfig) -> ModelConfig | None:
    """`m` with the traced dropout rates, or None when no rate is traced. The model reads its
    rates from its config, so a member's model is built from this one (layers.dropout takes a
    traced rate)."""
    rates = {f: getattr(self, f) for f in MODEL_FIELDS if getattr(self, f) is not None}
    return dataclasses.replace(m, **rates) if rates else None


def varying_keys(configs: Sequence[Config]) -> tuple[str, ...]:
  """The FIELDS keys whose values differ between `configs`."""
  return tuple(k for k in FIELDS if len({keyspec.lookup(c, k) for c in configs}) > 1)


def stacked(configs: Sequence[Config]) -> Hyper:
  """A Hyper of float32 [N] arrays (on host): each varying key's value in each of `configs`."""
  return Hyper(**{FIELDS[k]: np.asarray([keyspec.lookup(c, k) for c in configs], np.float32)
                  for k in varying_keys(configs)})
