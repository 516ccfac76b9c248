"""What the converters of every Hugging Face family share: the one-line error, the layer walk and
the vocabulary map (a family's `our_ids`: the id of ours each Hugging Face id is; the ids of ours
that no Hugging Face id is are model.excluded_ids, see transformer/convert/__init__.py)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from transformer.config import excluded_ids, id_ranges, ModelConfig


class ConvertError(ValueError):
  """A checkpoint or config that cannot be converted; the message is one line naming the key."""


def stack_layers(stack: dict[str, Any], num_layers: int) -> list[dict[str, Any]]:
  """Per-layer parameter dicts of an encoder or decoder stack, whether its layers are unrolled
  (layers_i) or scanned (layers: every leaf stacked on axis 0)."""
  if "layers" in stack:
    return [jax.tree.map(lambda x, i=i: np.asarray(x)[i], stack["layers"])
            for i in range(num_layers)]
  return [stack[f"layers_{i}"] for i in range(num_layers)]


def require(m: Any, need: dict[str, Any], family: str) -> None:
  """ConvertError naming the first model config key of `m` whose value is not `need`'s."""
  for key, want in need.items():
    if getattr(m, key) != want:
      raise ConvertError(f"model.{key}={getattr(m, key)!r} has no {family} counterpart "
                         f"(need {want!r})")


def positive_ints(hf: dict[str, Any], keys: tuple[str, ...]) -> None:
  """ConvertError naming the first config.json key that is not a positive integer."""
  for key in keys:
    if not isinstance(hf.get(key), int) or isinstance(hf.get(key), bool) or hf[key] <= 0:
      raise ConvertError(f"config.json: {key}={hf.get(key)!r} must be a positive integer")


def float32(state: dict[str, Any]) -> dict[str, np.ndarray]:
  """A state dict as contiguous float32 numpy arrays (what safetensors writes)."""
  return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in state.items()}


def unmapped_ids(ours: np.ndarray, vocab_size: int) -> str:
  """model.excluded_ids of a converted model: the ids below `vocab_size` that are in no
  Hugging Face id's place (`ours`: our id of each Hugging Face id)."""
  mapped = np.zeros(vocab_size, bool)
  mapped[ours] = True
  return id_ranges(np.flatnonzero(~mapped))


def require_unmapped_excluded(m: ModelConfig, ours: np.ndarray, family: str) -> None:
  """ConvertError when model.excluded_ids names an id that is some Hugging Face id's place
  (`ours`): the exported model could not keep it out of its softmax."""
  taken = sorted(set(excluded_ids(m)) & set(np.asarray(ours).tolist()))
  if taken:
    raise ConvertError(f"model.excluded_ids={m.excluded_ids!r} excludes id {taken[0]}, which "
                       f"{family} has (it would predict it again)")
