"""What the converters of every Hugging Face family share: the one-line error, config checks,
the layer walk and the vocabulary map (see transformer/convert/__init__.py)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from transformer.config import excluded_ids, id_ranges, ModelConfig


# Model config keys every converted model has (their families' own are each family's FIXED).
CONVERTED = dict(num_kv_heads=0, v_head_dim=0, share_src_tgt_embeddings=True,
                 scale_embeddings=False, prefix_lm=False, scan_layers=False, dtype="float32",
                 param_dtype="float32")


class ConvertError(ValueError):
  """A checkpoint or config that cannot be converted; the message is one line naming the key."""


def stack_layers(stack: dict[str, Any], num_layers: int) -> list[dict[str, Any]]:
  """Per-layer parameter dicts of a stack, unrolled (layers_i) or scanned (layers, axis 0)."""
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


def require_hf(hf: dict[str, Any], need: dict[str, Any]) -> None:
  """ConvertError naming the first config.json key that is set to other than `need`'s value."""
  for key, want in need.items():
    if hf.get(key, want) != want:
      raise ConvertError(f"config.json: {key}={hf[key]!r} has no counterpart here "
                         f"(need {want!r})")


def hf_choice(hf: dict[str, Any], key: str, default: str, ours: dict[str, str]) -> str:
  """Our value of config.json's `key` (`ours`: its values -> ours); ConvertError if unknown."""
  value = hf.get(key, default)
  if value not in ours:
    raise ConvertError(f"config.json: {key}={value!r} is not one of {'|'.join(ours)}")
  return ours[value]


def positive_ints(hf: dict[str, Any], keys: tuple[str, ...]) -> None:
  """ConvertError naming the first config.json key that is not a positive integer."""
  for key in keys:
    if not isinstance(hf.get(key), int) or isinstance(hf.get(key), bool) or hf[key] <= 0:
      raise ConvertError(f"config.json: {key}={hf.get(key)!r} must be a positive integer")


def float32(state: dict[str, Any]) -> dict[str, np.ndarray]:
  """A state dict as contiguous float32 numpy arrays (what safetensors writes)."""
  return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in state.items()}


def unmapped_ids(ours: np.ndarray, vocab_size: int) -> str:
  """model.excluded_ids of a converted model: the ids below `vocab_size` not in `ours`."""
  mapped = np.zeros(vocab_size, bool)
  mapped[ours] = True
  return id_ranges(np.flatnonzero(~mapped))


def require_unmapped_excluded(m: ModelConfig, ours: np.ndarray, family: str) -> None:
  """ConvertError when model.excluded_ids names an id in `ours` (some Hugging Face id's place):
  the exported model could not keep it out of its softmax."""
  taken = sorted(set(excluded_ids(m)) & set(np.asarray(ours).tolist()))
  if taken:
    raise ConvertError(f"model.excluded_ids={m.excluded_ids!r} excludes id {taken[0]}, which "
                       f"{family} has (it would predict it again)")


def hf_ffn(m: ModelConfig, said: Any, ours: dict[str, str], family: str) -> str:
  """config.json's name of model.ffn (`ours`: its names -> ours): `said`, the source's name, when
  it means the same, else the first that does; ConvertError if none does."""
  if ours.get(said) == m.ffn:
    return said
  names = [name for name, ffn in ours.items() if ffn == m.ffn]
  if not names:
    raise ConvertError(f"model.ffn={m.ffn!r} has no {family} counterpart (one of "
                       f"{'|'.join(dict.fromkeys(ours.values()))})")
  return names[0]
