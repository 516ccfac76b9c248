"""What every conversion checks of what it reads, whatever the family: the checkpoint's format,
each tensor against the config (its shape, none missing, none left over), finite values, and
config.json's special-token ids against the vocabulary. Each failure is one ConvertError line
naming the file, key or tensor."""

import json
import os
import re
from typing import Any, Iterator, Mapping

from flax import linen as nn
import jax
import numpy as np

from transformer import files
from transformer.config import ModelConfig
from transformer.convert.family import ConvertError
from transformer.model import models

# Weight files we read, in the order we look for them.
READ = ("model.safetensors", "pytorch_model.bin")
# Files of formats we do not read -> what they are.
UNREAD = {"model.safetensors.index.json": "a sharded safetensors checkpoint",
          "pytorch_model.bin.index.json": "a sharded PyTorch checkpoint",
          "tf_model.h5": "a TensorFlow checkpoint", "flax_model.msgpack": "a Flax checkpoint",
          "consolidated.00.pth": "Meta's original consolidated checkpoint"}
SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
# Special tokens whose role their name says: a BOS id on an end token (or an EOS id on a start
# token) is a config.json and a tokenizer.json of two models, or ids moved by hand.
START_TOKENS = ("<s>", "<|begin_of_text|>", "[CLS]")
END_TOKENS = ("</s>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "[SEP]")
OTHER_TOKENS = ("<pad>", "[PAD]", "<unk>", "[UNK]", "[MASK]")  # never a BOS or an EOS
NOT_A = {"bos": END_TOKENS + OTHER_TOKENS, "eos": START_TOKENS + OTHER_TOKENS, "pad": ()}


def weights_file(directory: str) -> str:
  """The weights file of a Hugging Face directory; ConvertError says plainly what it holds when
  it is none we read (a sharded checkpoint, another framework's format)."""
  for name in READ:
    if files.exists(os.path.join(directory, name)):
      return os.path.join(directory, name)
  held = files.listdir(directory) if files.isdir(directory) else []
  other = [f"{name} ({UNREAD[name]})" for name in held if name in UNREAD]
  other += [f"{name} (a GGUF file)" for name in held if name.endswith(".gguf")]
  if other:
    raise ConvertError(f"--from_hf={directory} holds {other[0]}, which is not read: only one "
                       f"{' or '.join(READ)} (save_pretrained(DIR, max_shard_size='1000GB', "
                       "safe_serialization=True) writes one)")
  raise ConvertError(f"--from_hf={directory}: no {' or '.join(READ)}")


def check_special_ids(hf: dict[str, Any], ids: int) -> None:
  """ConvertError naming config.json's first special-token id (bos/eos/pad/decoder start; an
  int or a list) that is not one of the `ids` ids the tokenizer and the weights both have."""
  for key in SPECIAL_IDS:
    values = hf.get(key)
    for value in values if isinstance(values, list) else [values]:
      if value is None:
        continue
      if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < ids:
        raise ConvertError(f"config.json: {key}={values!r} is not an id of the vocabulary "
                           f"(0..{ids - 1}, what both tokenizer.json and the weights have)")


def _ids(hf: dict[str, Any], key: str) -> list[int]:
  values = hf.get(key)
  return [v for v in (values if isinstance(values, list) else [values]) if v is not None]


def _named_token(tokenizer_config: dict[str, Any], role: str) -> str | None:
  """tokenizer_config.json's `role`_token: a string, or an AddedToken's dict with its content."""
  token = tokenizer_config.get(f"{role}_token")
  return token.get("content") if isinstance(token, dict) else token


def check_special_tokens(hf: dict[str, Any], tokenizer: Any,
                         tokenizer_config: dict[str, Any] | None = None) -> None:
  """ConvertError naming config.json's first bos/eos/pad id whose token in `tokenizer` (an
  HFTokenizer) is not one of tokenizer.json's special tokens, has the name of the other role
  (BOS on </s>), or is not the token tokenizer_config.json names for that role."""
  spec = json.loads(tokenizer.tokenizer_json)
  special = {t.get("id"): t.get("content") for t in spec.get("added_tokens", [])
             if isinstance(t, dict) and t.get("special")}
  for role in ("bos", "eos", "pad"):
    key, ids = f"{role}_token_id", _ids(hf, f"{role}_token_id")
    for value in ids:
      token = tokenizer.token(value)
      wrong = NOT_A[role]
      if (special and value not in special) or token in wrong:
        kind = "not one of its special tokens" if token not in wrong else f"no {role.upper()} token"
        raise ConvertError(f"config.json: {key}={hf[key]!r}, but tokenizer.json's id {value} is "
                           f"{token!r}, {kind} (are config.json and tokenizer.json one model's?)")
    named = _named_token(tokenizer_config or {}, role) if role != "pad" else None
    named_id = tokenizer.token_id(named) if isinstance(named, str) else None
    if ids and named_id is not None and named_id not in ids:
      raise ConvertError(f"config.json: {key}={hf[key]!r}, but tokenizer_config.json's "
                         f"{role}_token {named!r} is id {named_id} of tokenizer.json")


def param_shapes(m: ModelConfig) -> dict[str, tuple[int, ...]]:
  """The dotted path -> shape of each parameter model config `m` builds (unrolled layers)."""
  variables = jax.eval_shape(lambda: models.batch_init(
      models.build_model(m), {"params": jax.random.key(0)}, models.example_batch(m, 1)))
  leaves = jax.tree_util.tree_flatten_with_path(nn.meta.unbox(variables["params"]))[0]
  return {".".join(str(getattr(k, "key", k)) for k in path): tuple(x.shape)
          for path, x in leaves}


def finite(name: str, x: Any) -> np.ndarray:
  """`x` as a numpy array; ConvertError naming `name` when it holds a NaN or an infinity."""
  x = np.asarray(x)
  ok = np.isfinite(x.astype(np.float32)) if x.dtype.kind not in "biu" else True  # bfloat16: 'V'
  if not np.all(ok):
    bad = int(np.size(x) - np.sum(ok))
    raise ConvertError(f"{name} holds {bad} non-finite value{'s' if bad > 1 else ''} (NaN or "
                       f"inf) of {np.size(x)}: a model with them cannot be converted")
  return x


class Reading(Mapping):
  """A state dict that records which tensors are read and checks each is finite when read."""

  def __init__(self, state: Mapping[str, np.ndarray]):
    self._state, self.read = state, set()

  def __getitem__(self, key: str) -> np.ndarray:
    value = self._state[key]
    if key not in self.read:
      self.read.add(key)
      finite(key, value)
    return value

  def __contains__(self, key: object) -> bool:  # asking is not reading
    return key in self._state

  def __iter__(self) -> Iterator[str]:
    return iter(self._state)

  def __len__(self) -> int:
    return len(self._state)


def check_shapes(state: Mapping[str, np.ndarray], expected: dict[str, tuple[int, ...]]) -> None:
  """ConvertError naming the first tensor of `state` whose shape is not `expected`'s."""
  for key, shape in expected.items():
    if key in state and tuple(np.shape(state[key])) != shape:
      raise ConvertError(f"{key} has shape {tuple(np.shape(state[key]))}, config.json's sizes "
                         f"give {shape} (are config.json and the weights one model's?)")


def check_all_read(state: Mapping[str, np.ndarray], known: set[str], unused: tuple[str, ...],
                   family: str) -> None:
  """ConvertError naming the tensors of `state` that are not `known` and match no `unused`
  pattern: weights the config has no place for (more layers than it says, another head)."""
  left = sorted(k for k in state if k not in known
                and not any(re.fullmatch(p, k) for p in unused))
  if left:
    more = f" and {len(left) - 1} more" if len(left) > 1 else ""
    hint = " (more layers than config.json says?)" if re.search(r"\.\d+\.", left[0]) else ""
    raise ConvertError(f"the {family} weights hold {left[0]}{more}, which config.json's model "
                       f"has no place for{hint}")
