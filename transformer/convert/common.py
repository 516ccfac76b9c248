"""What the converters of every Hugging Face family share: config checks, the vocabulary map, the
converted workdir's config, and the weight tables: a family lists its parameters as `Weight`s
once, and `params_of` / `state_of` read that list in either direction (`params_of` checks every
tensor against the config on the way, checks.py). BERT and ViT share `encoder_layer`."""

from collections.abc import Mapping
import functools
import operator
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from transformer.config import Config, excluded_ids, from_configdict, id_ranges, ModelConfig
from transformer.convert import checks
from transformer.convert.family import ConvertError, Family
from transformer.data.tokenizers import EOS_ID, NUM_SPECIAL
from transformer.schema import get_config


# Model config keys every converted model has (their families' own are each family's FIXED).
CONVERTED = dict(num_kv_heads=0, v_head_dim=0, share_src_tgt_embeddings=True,
                 scale_embeddings=False, prefix_lm=False, scan_layers=False, dtype="float32",
                 param_dtype="float32")


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


def first_of(state: dict[str, np.ndarray], keys: tuple[str, ...], family: str) -> np.ndarray:
  """The first tensor of `keys` that `state` holds; ConvertError naming them if none."""
  for key in keys:
    if key in state:
      return state[key]
  raise ConvertError(f"the {family} weights have no {' or '.join(keys)}")


def first_id(value: Any) -> int | None:
  """A config.json token id (Llama 3 lists several end-of-sequence ids: the first), or None."""
  if isinstance(value, list):
    value = value[0] if value else None
  return value if isinstance(value, int) and not isinstance(value, bool) else None


def shifted_ids(hf: dict[str, Any]) -> np.ndarray:
  """Our id of each id of a decoder's config.json dict: id + NUM_SPECIAL (our 0 is padding), its
  end-of-sequence id our EOS, where decoding stops as `generate` stops."""
  ids = np.arange(hf["vocab_size"]) + NUM_SPECIAL
  eos_id = first_id(hf.get("eos_token_id"))
  if eos_id is not None and 0 <= eos_id < hf["vocab_size"]:
    ids[eos_id] = EOS_ID
  return ids


def start_embedding_id(hf: dict[str, Any], ours: np.ndarray, tied: bool) -> int:
  """model.start_embedding_id of a decoder: our id of its BOS where its embedding is tied (the
  start token then reads the one row Hugging Face starts with and also scores BOS with), else 0
  (an untied export writes our start token's row as BOS's)."""
  bos = first_id(hf.get("bos_token_id"))
  return int(ours[bos]) if tied and bos is not None and 0 <= bos < len(ours) else 0


def shifted_eos(m: ModelConfig) -> int | None:
  """The inverse of `shifted_ids` on export: the Hugging Face end-of-sequence id, whose shifted id
  is the one excluded id above NUM_SPECIAL (a model trained here has none: every id is its own,
  our EOS is dropped); ConvertError if the vocabulary leaves no Hugging Face ids."""
  if m.vocab_size <= NUM_SPECIAL:
    raise ConvertError(f"model.vocab_size={m.vocab_size} leaves no Hugging Face ids "
                       f"(ids below {NUM_SPECIAL} are ours)")
  excluded = excluded_ids(m)
  shifted = [i for i in excluded if i >= NUM_SPECIAL]
  return shifted[0] - NUM_SPECIAL if len(shifted) == 1 and EOS_ID not in excluded else None


def shifted_table(table: np.ndarray, hf: dict[str, Any], name: str, fill_keys: tuple[str, ...]
                  ) -> np.ndarray:
  """A table [V, ...] in our ids: each row at its `shifted_ids` place, the others copies of the
  row of the first in-range id among config.json's `fill_keys` (else the mean row)."""
  if table.shape[0] != hf["vocab_size"]:
    raise ConvertError(f"the {name} weights have {table.shape[0]} vocabulary rows, config.json "
                       f"vocab_size={hf['vocab_size']}")
  ids = [first_id(hf.get(k)) for k in fill_keys]
  ids = [i for i in ids if i is not None and 0 <= i < table.shape[0]]
  row = table[ids[0]] if ids else table.mean(axis=0).astype(table.dtype)
  out = np.repeat(row[None], table.shape[0] + NUM_SPECIAL, axis=0)
  out[shifted_ids(hf)] = table
  return out


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


def converted_config(model: dict[str, Any], hf_tokenizer: str, id_offset: int, length: int,
                     data: dict[str, Any], train: dict[str, Any], evaluation: dict[str, Any],
                     decode_len: int | None = None) -> Config:
  """The full config of a converted model: `model`'s keys, the Hugging Face tokenizer, sequences
  of `length`, constant-rate training, no best checkpoint, greedy decoding if given its length."""
  cd = get_config()
  cd.model.update(model)
  cd.data.update(tokenizer="hf", source_tokenizer="", hf_tokenizer=hf_tokenizer,
                 hf_id_offset=id_offset, max_source_len=length, max_target_len=length,
                 batch_size=8, **data)
  cd.train.update(schedule="constant", warmup_steps=0, label_smoothing=0.0, grad_clip=1.0, **train)
  cd.eval.update(num_decode_examples=0, **evaluation)
  if decode_len is not None:
    cd.eval.decode.update(method="greedy", max_decode_len=decode_len)
  cd.checkpoint.update(keep_best_by="")
  return from_configdict(cd)


class Weight(NamedTuple):
  """One of our parameters (its dotted path) and how it is made of Hugging Face tensors."""
  path: str
  to_ours: Callable[[dict[str, np.ndarray]], np.ndarray]  # a state dict -> our parameter
  to_hf: Callable[[Any], dict[str, np.ndarray]]  # our parameter -> its state dict entries


def transpose(x: Any) -> np.ndarray:
  """A torch Linear weight [out, in] <-> our kernel [in, out]."""
  return np.asarray(x).T


def reshaped(*shape: int) -> Callable[[Any], np.ndarray]:
  return lambda x: np.reshape(x, shape)


def one(path: str, key: str, to_ours: Callable = np.asarray, to_hf: Callable = np.asarray
        ) -> Weight:
  """Our parameter `path` is tensor `key` through `to_ours`, and `key` it through `to_hf`."""
  return Weight(path, lambda state: to_ours(state[key]), lambda x: {key: to_hf(x)})


def stacked(path: str, keys: tuple[str, ...], axis: int, to_ours: Callable = np.asarray,
            to_hf: Callable = np.asarray) -> Weight:
  """Our parameter `path` stacks the tensors `keys` (each through `to_ours`) on `axis`."""
  return Weight(path, lambda state: np.stack([to_ours(state[k]) for k in keys], axis),
                lambda x: {k: to_hf(np.take(np.asarray(x), j, axis)) for j, k in enumerate(keys)})


def norm(path: str, key: str, bias: bool = True) -> list[Weight]:
  """A norm's scale (and bias) from `key`.weight (and `key`.bias)."""
  scale = one(f"{path}.scale", f"{key}.weight")
  return [scale, one(f"{path}.bias", f"{key}.bias")] if bias else [scale]


def dense(path: str, key: str, to_ours: Callable = np.asarray, to_hf: Callable = np.asarray
          ) -> list[Weight]:
  """A dense layer's kernel (through to_ours / to_hf) and bias from `key`.weight and `key`.bias."""
  return [one(f"{path}.kernel", f"{key}.weight", to_ours, to_hf),
          one(f"{path}.bias", f"{key}.bias")]


def encoder_layer(m: ModelConfig, p: str, q: str, attention: str, norms: tuple[str, str]
                  ) -> list[Weight]:
  """One layer of a BERT-style encoder (BERT's, ViT's), ours `p`, Hugging Face's `q`: q/k/v
  `{q}.attention.{attention}.query|key|value`, `{q}.attention.output.dense`,
  `{q}.intermediate.dense`, `{q}.output.dense`, and the LayerNorms `norms` (the attention's, the
  feed-forward's; the layer's order, pre or post, is the model config's)."""
  d, n = m.d_model, m.num_heads
  h = d // n
  qkv = lambda what: tuple(f"{q}.attention.{attention}.{x}.{what}"  # noqa: E731
                           for x in ("query", "key", "value"))
  return [
      stacked(f"{p}.self_attention.qkv.kernel", qkv("weight"), 1,
              lambda w: w.T.reshape(d, n, h), lambda k: k.reshape(d, d).T),
      stacked(f"{p}.self_attention.qkv.bias", qkv("bias"), 0, reshaped(n, h), reshaped(d)),
      *dense(f"{p}.self_attention.out", f"{q}.attention.output.dense",
             lambda w: w.T.reshape(n, h, d), lambda k: np.asarray(k).reshape(d, d).T),
      *norm(f"{p}.attention_norm", norms[0]),
      *dense(f"{p}.ffn.wi", f"{q}.intermediate.dense", transpose, transpose),
      *dense(f"{p}.ffn.wo", f"{q}.output.dense", transpose, transpose),
      *norm(f"{p}.ffn_norm", norms[1])]


def params_of(state: dict[str, np.ndarray], weights: list[Weight], family: Family,
              m: ModelConfig) -> dict[str, Any]:
  """Our parameters (unrolled layers) from a Hugging Face state dict, by `weights`, after the
  checks every family gets (checks.py): each tensor the shape model config `m` needs, finite,
  none missing and none left unread but the family's `unused`; else a ConvertError naming it."""
  shapes = checks.param_shapes(m)
  expected = {k: tuple(np.shape(v)) for w in weights if w.path in shapes
              for k, v in w.to_hf(np.zeros(shapes[w.path], np.float32)).items()}
  checks.check_shapes(state, expected)
  reading = checks.Reading(state)
  params: dict[str, Any] = {}
  for w in weights:
    *parents, leaf = w.path.split(".")
    node = params
    for key in parents:
      node = node.setdefault(key, {})
    try:
      node[leaf] = w.to_ours(reading)
    except KeyError as e:
      raise ConvertError(f"the {family.name} weights have no {e.args[0]}") from None
  checks.check_all_read(state, reading.read | set(expected), family.unused, family.name)
  return params


def state_of(params: Any, weights: list[Weight]) -> dict[str, np.ndarray]:
  """The Hugging Face state dict (contiguous float32 numpy) of our parameters, by `weights`; a
  parameter holding a NaN or an infinity is a ConvertError naming it."""
  params = _unrolled(params)
  out: dict[str, Any] = {}
  for w in weights:
    value = functools.reduce(operator.getitem, w.path.split("."), params)
    out |= w.to_hf(checks.finite(f"parameter {w.path}", value))
  return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in out.items()}


def _unrolled(tree: Any) -> Any:
  """`tree` with each scanned stack of layers (`layers`, layer axis 0) as layers_0, layers_1..."""
  if not isinstance(tree, Mapping):
    return tree
  out = {k: _unrolled(v) for k, v in tree.items() if k != "layers"}
  if "layers" in tree:
    for i in range(len(jax.tree.leaves(tree["layers"])[0])):
      out[f"layers_{i}"] = jax.tree.map(lambda x, i=i: np.asarray(x)[i], tree["layers"])
  return out
