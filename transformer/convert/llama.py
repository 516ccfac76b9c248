"""Llama 2 and 3, Mistral and Qwen2 (`LlamaForCausalLM`, `MistralForCausalLM`,
`Qwen2ForCausalLM`) <-> our DecoderOnly: configs and weights.

The family is our decoder_only with pre-norm RMSNorm, RoPE (`model.rope_base`, Llama 3's
`model.rope_scaling`), SwiGLU, grouped-query attention (`model.num_kv_heads`) and no biases;
Mistral adds `model.sliding_window`, Qwen2 `model.qkv_bias`. Hugging Face's RoPE rotates half
the head as ours does, so the q/k rows map as they are. A Linear weight [out, in] is our kernel
transposed, split into heads; q, k and v stack into our `qkv` (multi-head) or `query` + `kv`.
Ids: ours = Hugging Face's + 4, its end-of-sequence id at our EOS (as GPT-2's); our ids in no
Hugging Face id's place are `model.excluded_ids`, their embedding rows copies of its BOS row, so
our start token 0 reads as the BOS that begins its documents. Back, an untied model's BOS
embedding row is our start token's (what a run fine-tuned here reads before each document, where
Hugging Face reads BOS); a tied one's is BOS's own (its row also scores BOS as a next token).

The tables are per part (`vocab_weights`, `attention_weights`, `ffn_weights`, `layer_weights`)
and the config maps per concern (`shared_overrides`, `shared_hf_config`), so a family with
another feed-forward (a mixture of experts) reuses the rest.
"""

from typing import Any, Callable

import numpy as np

from transformer.config import Config, ModelConfig
from transformer.convert.common import (CONVERTED, converted_config, ConvertError, first_id,
                                        hf_choice, norm, one, params_of, positive_ints, require,
                                        require_hf, require_unmapped_excluded, shifted_eos,
                                        shifted_ids, shifted_table, stacked,
                                        start_embedding_id, state_of, transpose, unmapped_ids,
                                        Weight)
from transformer.convert.family import Family
from transformer.data.tokenizers import NUM_SPECIAL, PAD_ID  # PAD_ID: our start token too

MODEL_TYPE, NAME, ARCH = "llama", "Llama", "decoder_only"
MODEL_TYPES = ("llama", "mistral", "qwen2")
NAMES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}
ID_OFFSET = NUM_SPECIAL
# Our model config keys the family fixes: set on import, required on export.
FIXED = dict(arch="decoder_only", positional="rope", norm="rmsnorm", norm_position="pre",
             ffn="swiglu", scale_embeddings=False, scale_attention_logits=True,
             scale_decoder_output=False, embedding_norm=False, head_transform=False,
             logits_bias=False, ffn_dropout_rate=0.0)
# config.json keys whose other values we lack: required on import, written on export.
HF_FIXED = dict(hidden_act="silu")
# Tensors no parameter reads: RoPE's buffers in older files; lm_head.weight of a tied head.
UNUSED = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"lm_head\.weight")
_ROPE_TYPES = {"default": "none", "linear": "linear", "llama3": "llama3"}
_LENGTH = 1024  # the converted workdir's data lengths (the checkpoints' contexts are far longer)


def our_ids(hf: dict[str, Any]) -> np.ndarray:
  """Our id of each Hugging Face id of a config.json dict: id + NUM_SPECIAL, eos our EOS."""
  return shifted_ids(hf)


def rope_overrides(hf: dict[str, Any]) -> dict[str, Any]:
  """Our rope keys of config.json's rope_parameters (transformers 5) or rope_theta and
  rope_scaling (older files); ConvertError names a scaling we lack."""
  rope = dict(hf.get("rope_parameters") or {})
  legacy = hf.get("rope_scaling") or {}
  rope = {"rope_theta": hf.get("rope_theta", 10000.0), **legacy, **rope}
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind not in _ROPE_TYPES:
    raise ConvertError(f"config.json: rope_type={kind!r} is not one of {'|'.join(_ROPE_TYPES)}")
  if rope.get("partial_rotary_factor", 1.0) != 1.0:
    raise ConvertError(f"config.json: partial_rotary_factor={rope['partial_rotary_factor']!r} "
                       "has no counterpart here (need 1.0)")
  out = dict(rope_base=float(rope["rope_theta"]), rope_scaling=_ROPE_TYPES[kind])
  if kind != "default":
    out["rope_scaling_factor"] = float(rope["factor"])
  if kind == "llama3":
    out |= dict(rope_low_freq_factor=float(rope["low_freq_factor"]),
                rope_high_freq_factor=float(rope["high_freq_factor"]),
                rope_original_max_len=int(rope["original_max_position_embeddings"]))
  return out


def rope_hf(m: ModelConfig) -> dict[str, Any]:
  """config.json's rope_parameters of our rope keys."""
  kind = {v: k for k, v in _ROPE_TYPES.items()}[m.rope_scaling]
  out = {"rope_type": kind, "rope_theta": m.rope_base}
  if kind != "default":
    out["factor"] = m.rope_scaling_factor
  if kind == "llama3":
    out |= {"low_freq_factor": m.rope_low_freq_factor, "high_freq_factor": m.rope_high_freq_factor,
            "original_max_position_embeddings": m.rope_original_max_len}
  return out


def _tied(hf: dict[str, Any], state: dict[str, np.ndarray] | None) -> bool:
  """Whether the head is the embedding: the weights say (no lm_head.weight, or one equal to the
  embedding) when given, else config.json's tie_word_embeddings."""
  if state is None or "model.embed_tokens.weight" not in state:
    return bool(hf.get("tie_word_embeddings", False))
  head = state.get("lm_head.weight")
  return head is None or np.array_equal(head, state["model.embed_tokens.weight"])


def shared_overrides(hf: dict[str, Any], state: dict[str, np.ndarray] | None = None
                     ) -> dict[str, Any]:
  """Our model config keys every Llama-shaped config.json maps the same way (sizes, RoPE, norm,
  vocabulary, head); ConvertError names an unmappable key."""
  require_hf(hf, HF_FIXED)
  positive_ints(hf, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "max_position_embeddings"))
  heads = hf["num_attention_heads"]
  head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
  vocab, tied = hf["vocab_size"] + NUM_SPECIAL, _tied(hf, state)
  return CONVERTED | FIXED | rope_overrides(hf) | dict(
      vocab_size=vocab, source_vocab_size=vocab, excluded_ids=unmapped_ids(our_ids(hf), vocab),
      d_model=hf["hidden_size"], num_heads=heads,
      num_kv_heads=hf.get("num_key_value_heads") or heads, head_dim=head_dim,
      mlp_dim=hf["intermediate_size"], num_encoder_layers=0,
      num_decoder_layers=hf["num_hidden_layers"], norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      dropout_rate=0.0, attention_dropout_rate=float(hf.get("attention_dropout", 0.0)),
      tie_embeddings=tied, max_len=hf["max_position_embeddings"],
      start_embedding_id=start_embedding_id(hf, our_ids(hf), tied))


def _family_overrides(hf: dict[str, Any]) -> dict[str, Any]:
  """Our bias and window keys of a Llama, Mistral or Qwen2 config.json dict."""
  kind = hf["model_type"]
  if kind == "llama":
    if bool(hf.get("attention_bias", False)) != bool(hf.get("mlp_bias", False)):
      raise ConvertError(f"config.json: attention_bias={hf.get('attention_bias')!r} with "
                         f"mlp_bias={hf.get('mlp_bias')!r} has no counterpart here (model.use_bias "
                         "biases both)")
    return dict(use_bias=bool(hf.get("attention_bias", False)), qkv_bias=False, sliding_window=0)
  if kind == "qwen2":
    layer_types = hf.get("layer_types") or []
    if hf.get("use_sliding_window") or any(t != "full_attention" for t in layer_types):
      raise ConvertError("config.json: use_sliding_window=true (Qwen2's window on some layers) "
                         "has no counterpart here (model.sliding_window is every layer's)")
    return dict(use_bias=False, qkv_bias=True, sliding_window=0)
  return dict(use_bias=False, qkv_bias=False, sliding_window=sliding_window_of(hf))


def sliding_window_of(hf: dict[str, Any]) -> int:
  """model.sliding_window of config.json's sliding_window (null: 0, every key)."""
  window = hf.get("sliding_window")
  if window is not None and (not isinstance(window, int) or window <= 0):
    raise ConvertError(f"config.json: sliding_window={window!r} must be a positive integer or "
                       "null")
  return window or 0


def model_overrides(hf: dict[str, Any], state: dict[str, np.ndarray] | None = None
                    ) -> dict[str, Any]:
  """Our model config keys for a Llama, Mistral or Qwen2 config.json dict (and its weights,
  which say whether the head is tied); ConvertError names an unmappable key."""
  hf_choice(hf, "model_type", "llama", {t: t for t in MODEL_TYPES})
  return shared_overrides(hf, state) | _family_overrides(hf)


def model_type_of(m: ModelConfig, extra: dict[str, Any] | None = None) -> str:
  """The config.json model_type `m` exports as: the source's, else Qwen2 for q/k/v biases,
  Mistral for a sliding window, Llama otherwise."""
  if (extra or {}).get("model_type") in MODEL_TYPES:
    return extra["model_type"]
  return "qwen2" if m.qkv_bias else "mistral" if m.sliding_window else "llama"


def _check_family(m: ModelConfig, kind: str) -> None:
  """ConvertError naming a bias or window key `kind` has no counterpart for."""
  need = {"llama": dict(qkv_bias=False, sliding_window=0),
          "mistral": dict(use_bias=False, qkv_bias=False),
          "qwen2": dict(use_bias=False, qkv_bias=True, sliding_window=0)}[kind]
  require(m, need, NAMES[kind])


def shared_hf_config(m: ModelConfig, extra: dict[str, Any] | None, kind: str,
                     fixed: dict[str, Any] | None = None) -> dict[str, Any]:
  """The config.json keys every Llama-shaped family writes the same way, over `extra`'s;
  ConvertError names a model key without a counterpart (`fixed`: the family's FIXED)."""
  name = NAMES.get(kind, kind.capitalize())
  require(m, (FIXED if fixed is None else fixed) | {"v_head_dim": m.head_dim}, name)
  eos = shifted_eos(m)
  out = {"bos_token_id": eos, "eos_token_id": eos} | dict(extra or {})
  if first_id(out.get("eos_token_id")) != eos:
    out["eos_token_id"] = eos
  out |= {"model_type": kind, "vocab_size": m.vocab_size - NUM_SPECIAL, "hidden_size": m.d_model,
          "intermediate_size": m.mlp_dim, "num_hidden_layers": m.num_decoder_layers,
          "num_attention_heads": m.num_heads, "num_key_value_heads": m.num_kv_heads,
          "max_position_embeddings": m.max_len,
          "rms_norm_eps": m.norm_eps, "attention_dropout": m.attention_dropout_rate,
          "tie_word_embeddings": m.tie_embeddings, "rope_parameters": rope_hf(m)} | HF_FIXED
  if "head_dim" in out or m.head_dim * m.num_heads != m.d_model:  # else derived as ours is
    out["head_dim"] = m.head_dim
  for legacy in ("rope_theta", "rope_scaling"):  # rope_parameters says it; two sources could differ
    out.pop(legacy, None)
  require_unmapped_excluded(m, our_ids(out), name)
  return out


def hf_config(m: ModelConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
  """The Llama, Mistral or Qwen2 config.json dict of `m` (over `extra`'s, whose model_type is
  kept); ConvertError names a key the family lacks."""
  kind = model_type_of(m, extra)
  _check_family(m, kind)
  out = shared_hf_config(m, extra, kind)
  out["architectures"] = [f"{NAMES[kind]}ForCausalLM"]
  if kind == "llama":
    out |= {"attention_bias": m.use_bias, "mlp_bias": m.use_bias}
  elif kind == "mistral":
    out["sliding_window"] = m.sliding_window or None
  else:
    out |= {"use_sliding_window": False, "sliding_window": None,
            "layer_types": ["full_attention"] * m.num_decoder_layers}
  return out


def exports(m: ModelConfig) -> bool:
  """Whether a decoder-only model config exports as this family (RMSNorm: GPT-2 has none; a
  mixture of experts is Mixtral's)."""
  return m.norm == "rmsnorm" and m.ffn != "moe"


def workdir_config(hf: dict[str, Any], state: dict[str, np.ndarray], hf_tokenizer: str,
                   text_file: str = "", data_dir: str = "") -> Config:
  """The full config of a converted Llama, Mistral or Qwen2, an LM over `text_file` if given."""
  return decoder_config(model_overrides(hf, state), hf_tokenizer, text_file, data_dir)


def decoder_config(m: dict[str, Any], hf_tokenizer: str, text_file: str = "", data_dir: str = "",
                   train: dict[str, Any] | None = None) -> Config:
  """The full config of a converted Llama-shaped model of model keys `m` (and `train` keys)."""
  length = min(_LENGTH, m["max_len"])
  return converted_config(
      m, hf_tokenizer, ID_OFFSET, length,
      data=dict(dataset="text_files" if text_file else "", text_file=text_file,
                data_dir=data_dir, batching="pack"),
      train=dict(optimizer="adamw", learning_rate=1e-5, b2=0.95, eps=1e-8) | (train or {}),
      evaluation=dict(metrics="bpc", num_batches=20), decode_len=min(64, length // 2))


def _our_table(table: np.ndarray, hf: dict[str, Any]) -> np.ndarray:
  """A table [V, ...] in our ids: each row at its `our_ids` place, the others copies of the BOS
  row (else the end-of-sequence row, else the mean row)."""
  return shifted_table(table, hf, NAME, ("bos_token_id", "eos_token_id"))


def _hf_embedding(x: Any, ours: np.ndarray, hf: dict[str, Any], m: ModelConfig) -> np.ndarray:
  """Hugging Face's embedding rows of our table `x`: row `ours[i]` for id i, and for an untied
  model the BOS id's row our start token's (the module doc)."""
  rows = np.asarray(x)[ours]
  bos = first_id(hf.get("bos_token_id"))
  if not m.tie_embeddings and bos is not None and 0 <= bos < len(rows):
    rows[bos] = np.asarray(x)[PAD_ID]
  return rows


def vocab_weights(m: ModelConfig, hf: dict[str, Any] | None) -> list[Weight]:
  """The embedding, the final norm and an untied head."""
  hf = dict(hf or {}, vocab_size=m.vocab_size - NUM_SPECIAL)
  ours = our_ids(hf)
  weights = [one("token_embed.embedding", "model.embed_tokens.weight",
                 lambda x: _our_table(x, hf), lambda x: _hf_embedding(x, ours, hf, m)),
             *norm("decoder.final_norm", "model.norm", bias=False)]
  if not m.tie_embeddings:
    weights.append(one("decoder.logits_dense.kernel", "lm_head.weight",
                       lambda x: _our_table(x, hf).T, lambda x: np.asarray(x).T[ours]))
  return weights


def _heads(rows: int, h: int, d: int) -> tuple[Callable, Callable]:
  """(to ours, to Hugging Face) of a projection weight [rows*h, d] <-> our kernel [d, rows, h]."""
  return (lambda x: np.asarray(x).T.reshape(d, rows, h),
          lambda x: np.asarray(x).reshape(d, rows * h).T)


def attention_weights(m: ModelConfig, p: str, q: str) -> list[Weight]:
  """Layer prefix `p` (ours) / `q` (Hugging Face's): its self-attention's projections."""
  n, k, h, d = m.num_heads, m.num_kv_heads, m.head_dim, m.d_model
  names = [f"{q}.self_attn.{x}_proj" for x in "qkv"]
  biased = m.use_bias or m.qkv_bias
  if k == n:  # our fused qkv [d, 3, n, h]
    groups = [("qkv", names, n)]
  else:  # our query [d, n, h] and kv [d, 2, k, h]
    groups = [("query", names[:1], n), ("kv", names[1:], k)]
  weights = []
  for ours, keys, rows in groups:
    to_ours, to_hf = _heads(rows, h, d)
    path = f"{p}.self_attention.{ours}"
    if len(keys) == 1:
      weights.append(one(f"{path}.kernel", f"{keys[0]}.weight", to_ours, to_hf))
      if biased:
        weights.append(one(f"{path}.bias", f"{keys[0]}.bias", lambda x, r=rows: np.reshape(
            x, (r, h)), lambda x: np.reshape(x, -1)))
      continue
    weights.append(stacked(f"{path}.kernel", tuple(f"{x}.weight" for x in keys), 1, to_ours,
                           to_hf))
    if biased:
      weights.append(stacked(f"{path}.bias", tuple(f"{x}.bias" for x in keys), 0,
                             lambda x, r=rows: np.reshape(x, (r, h)), lambda x: np.reshape(x, -1)))
  out_key = f"{q}.self_attn.o_proj"
  weights.append(one(f"{p}.self_attention.out.kernel", f"{out_key}.weight",
                     lambda x: np.asarray(x).T.reshape(n, h, d),
                     lambda x: np.asarray(x).reshape(n * h, d).T))
  if m.use_bias:
    weights.append(one(f"{p}.self_attention.out.bias", f"{out_key}.bias"))
  return weights


def ffn_weights(m: ModelConfig, p: str, q: str) -> list[Weight]:
  """Layer prefix `p` / `q`: its SwiGLU feed-forward (gate, up, down)."""
  weights = []
  for ours, theirs in (("wi_gate", "gate_proj"), ("wi_up", "up_proj"), ("wo", "down_proj")):
    weights.append(one(f"{p}.ffn.{ours}.kernel", f"{q}.mlp.{theirs}.weight", transpose,
                       transpose))
    if m.use_bias:
      weights.append(one(f"{p}.ffn.{ours}.bias", f"{q}.mlp.{theirs}.bias"))
  return weights


def layer_weights(m: ModelConfig, i: int,
                  ffn: Callable[[ModelConfig, str, str], list[Weight]] = ffn_weights
                  ) -> list[Weight]:
  """Layer `i`: its two norms, its attention and its feed-forward (`ffn`'s table)."""
  p, q = f"decoder.layers_{i}", f"model.layers.{i}"
  return [*norm(f"{p}.attention_norm", f"{q}.input_layernorm", bias=False),
          *attention_weights(m, p, q),
          *norm(f"{p}.ffn_norm", f"{q}.post_attention_layernorm", bias=False),
          *ffn(m, p, q)]


def weights(m: ModelConfig, hf: dict[str, Any] | None,
            ffn: Callable[[ModelConfig, str, str], list[Weight]] = ffn_weights) -> list[Weight]:
  """Our DecoderOnly's parameters and the Hugging Face tensors they are made of."""
  out = vocab_weights(m, hf)
  for i in range(m.num_decoder_layers):
    out += layer_weights(m, i, ffn)
  return out


def params_from_hf(state: dict[str, np.ndarray], m: ModelConfig, hf: dict[str, Any],
                   tokenizer: Any = None) -> dict[str, Any]:
  """Our DecoderOnly parameters (unrolled layers) from a ...ForCausalLM state dict."""
  del tokenizer  # the specials are in the config
  return params_of(state, weights(m, hf), FAMILY, m)


def hf_from_params(params: Any, m: ModelConfig, hf: dict[str, Any] | None = None
                   ) -> dict[str, np.ndarray]:
  """The ...ForCausalLM state dict (float32 numpy) of our parameters, `hf` its config.json."""
  return state_of(params, weights(m, hf))


def describe_shape(m: ModelConfig, name: str, extras: list[str]) -> str:
  """'<name>-shaped model with L layers, ..., <extras>, vocabulary ...' (a converted workdir)."""
  return (f"{name}-shaped model with {m.num_decoder_layers} layers, d_model {m.d_model}, "
          f"{m.num_heads} heads / {m.num_kv_heads} kv heads{''.join(', ' + e for e in extras)}, "
          f"vocabulary {m.vocab_size} ({NUM_SPECIAL} ours + {m.vocab_size - NUM_SPECIAL}; never "
          f"predicted: {m.excluded_ids or 'none'})")


def describe_workdir(cfg: Config) -> str:
  m = cfg.model
  extras = [f"sliding window {m.sliding_window}"] if m.sliding_window else []
  extras += ["q/k/v biases"] if m.qkv_bias else []
  extras += [f"RoPE scaling {m.rope_scaling}"] if m.rope_scaling != "none" else []
  return describe_shape(m, NAMES[model_type_of(m)], extras)


def describe_hf(hf: dict[str, Any]) -> str:
  return (f"{NAMES.get(hf.get('model_type'), NAME)} with {hf['num_hidden_layers']} layers, "
          f"vocabulary {hf['vocab_size']}")


FAMILY = Family(
    name=NAME, model_types=MODEL_TYPES, arch=ARCH, id_offset=ID_OFFSET, fixed=FIXED,
    hf_fixed=HF_FIXED, model_overrides=model_overrides, workdir_config=workdir_config,
    hf_config=hf_config, params_from_hf=params_from_hf, hf_from_params=hf_from_params,
    describe_workdir=describe_workdir, describe_hf=describe_hf,
    exports=exports, unused=UNUSED,
    module=__name__)
