r"""GPT-2 (`GPT2LMHeadModel`) <-> our DecoderOnly: configs and weights (transformer/convert drives).

GPT-2 in our knobs: decoder_only, pre-LN with a final LayerNorm (`norm_position='pre'`, LayerNorm
with bias, `norm_eps` = layer_norm_epsilon), learned positions (`positional='learned'`, `max_len` =
n_positions), biases everywhere (`use_bias`), tanh GELU (`ffn='gelu_tanh'`), unscaled embeddings
(`scale_embeddings=False`), tied head (`tie_embeddings`), attention scaled by 1/sqrt(head_dim)
(`scale_attention_logits`). GPT-2's fused Conv1D c_attn weight [d, 3d] (columns q | k | v, heads
major) is exactly our fused `qkv` kernel [d, 3, n, h] reshaped; Conv1D weights are [in, out] like
our kernels. Dropout: resid_pdrop -> model.dropout_rate (ours also drops the embeddings with it:
embd_pdrop is not kept separately), attn_pdrop -> attention_dropout_rate.

Token ids: our id = Hugging Face id + NUM_SPECIAL (4; `data.hf_id_offset=4`), except GPT-2's
<|endoftext|> (eos_token_id), whose place is our EOS (1): `our_ids`. Our code reserves ids 0-3
(pad, which is also the decoder's start token; EOS; BOS; UNK: data/tokenizers.py) and treats id 0
as padding (segment ids default to tokens != 0), while GPT-2's id 0 is "!"; shifting every id keeps
GPT-2's vocabulary intact and ours unchanged. <|endoftext|> is what our EOS means to GPT-2: the end
of a document, where decoding stops as Hugging Face's generate stops. The ids of ours that are no
GPT-2 id's place (0, 2, 3 and <|endoftext|>'s shifted id eos_token_id + 4; also 1 when the config
has no eos_token_id) are `model.excluded_ids`: probability 0, so the softmax over our vocabulary
is GPT-2's, id for id (the tokenizer still encodes a literal "<|endoftext|>" as the shifted id,
which then scores -1e30). Their embedding rows are copies of <|endoftext|>'s row (the mean row
without one): the start token 0 reads as the <|endoftext|> GPT-2 saw before every document. Export
takes each GPT-2 row from its place (`our_ids` of the written config.json, whose
eos_token_id, when no source config.json says it, is the excluded shifted id), so HF -> ours -> HF
is bitwise equal, and a fine-tuned run's EOS row becomes <|endoftext|>'s. (A decoder-only seq2seq run,
`model.prefix_lm`, exports as GPT-2 is: causal over the prompt too.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from transformer.config import Config, excluded_ids, from_configdict, ModelConfig
from transformer.schema import get_config
from transformer.convert.common import (ConvertError, float32, positive_ints, require,
                                        require_unmapped_excluded, stack_layers, unmapped_ids)
from transformer.data.tokenizers import EOS_ID, NUM_SPECIAL

MODEL_TYPE, NAME, ARCH = "gpt2", "GPT-2", "decoder_only"
ID_OFFSET = NUM_SPECIAL
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                "relu": "relu"}
_HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def our_ids(hf: dict[str, Any]) -> np.ndarray:
  """Our id of each GPT-2 id of a config.json dict: id + NUM_SPECIAL, <|endoftext|> our EOS."""
  ids = np.arange(hf["vocab_size"]) + NUM_SPECIAL
  eos_id = hf.get("eos_token_id")
  if isinstance(eos_id, int) and 0 <= eos_id < hf["vocab_size"]:
    ids[eos_id] = EOS_ID
  return ids


def model_overrides(hf: dict[str, Any], state: dict[str, np.ndarray] | None = None
                    ) -> dict[str, Any]:
  """Our model config keys for a GPT-2 config.json dict; ConvertError names an unmappable key."""
  del state  # GPT-2's config says all
  checks = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
            "add_cross_attention": False}
  for key, want in checks.items():
    if hf.get(key, want) != want:
      raise ConvertError(f"config.json: {key}={hf[key]!r} has no counterpart here (need {want})")
  positive_ints(hf, ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"))
  act = hf.get("activation_function", "gelu_new")
  if act not in _ACTIVATIONS:
    raise ConvertError(f"config.json: activation_function={act!r} is not one of "
                       f"{'|'.join(_ACTIVATIONS)}")
  d, heads = hf["n_embd"], hf["n_head"]
  return dict(
      arch="decoder_only", vocab_size=hf["vocab_size"] + NUM_SPECIAL,
      excluded_ids=unmapped_ids(our_ids(hf), hf["vocab_size"] + NUM_SPECIAL),
      source_vocab_size=hf["vocab_size"] + NUM_SPECIAL,  # as training fills it in for an LM
      d_model=d, num_heads=heads, num_kv_heads=0, head_dim=0, v_head_dim=0,
      mlp_dim=hf.get("n_inner") or 4 * d, num_encoder_layers=0, num_decoder_layers=hf["n_layer"],
      positional="learned", norm="layernorm", norm_position="pre",
      norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), ffn=_ACTIVATIONS[act], use_bias=True,
      scale_attention_logits=True, scale_decoder_output=False,
      dropout_rate=float(hf.get("resid_pdrop", 0.1)),
      attention_dropout_rate=float(hf.get("attn_pdrop", 0.1)), ffn_dropout_rate=0.0,
      tie_embeddings=bool(hf.get("tie_word_embeddings", True)), share_src_tgt_embeddings=True,
      scale_embeddings=False, prefix_lm=False, scan_layers=False, dtype="float32",
      param_dtype="float32", max_len=hf["n_positions"])


def _endoftext(m: ModelConfig) -> int | None:
  """The GPT-2 id whose place is our EOS, read from a converted run's model.excluded_ids (its
  shifted id is the one excluded id above NUM_SPECIAL, with EOS itself kept); None if none."""
  excluded = excluded_ids(m)
  shifted = [i for i in excluded if i >= NUM_SPECIAL]
  return shifted[0] - NUM_SPECIAL if len(shifted) == 1 and EOS_ID not in excluded else None


def hf_config(m: ModelConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
  """The GPT-2 config.json dict of model config `m`; ConvertError names the first key GPT-2 lacks.

  `extra` (the source's config.json, for a converted run) gives the keys with no counterpart in
  ours (token ids, initializer range, ...); architecture keys always come from `m`. Without it
  (e.g. a converted run fine-tuned in another workdir), <|endoftext|> (bos and eos) is the id
  that model.excluded_ids says was moved to our EOS.
  """
  if m.d_model % m.num_heads:
    raise ConvertError(f"model.head_dim={m.head_dim} has no GPT-2 counterpart (GPT-2's is "
                       f"d_model / num_heads, and model.num_heads={m.num_heads} does not divide "
                       f"model.d_model={m.d_model})")
  require(m, {"arch": "decoder_only", "positional": "learned", "norm": "layernorm",
              "norm_position": "pre", "use_bias": True, "scale_embeddings": False,
              "scale_attention_logits": True, "scale_decoder_output": False,
              "num_kv_heads": m.num_heads, "head_dim": m.d_model // m.num_heads,
              "v_head_dim": m.d_model // m.num_heads, "ffn_dropout_rate": 0.0}, NAME)
  if m.ffn not in _HF_ACTIVATION:
    raise ConvertError(f"model.ffn={m.ffn!r} has no GPT-2 counterpart (one of "
                       f"{'|'.join(_HF_ACTIVATION)})")
  if m.vocab_size <= NUM_SPECIAL:
    raise ConvertError(f"model.vocab_size={m.vocab_size} leaves no Hugging Face ids "
                       f"(ids below {NUM_SPECIAL} are ours)")
  eot = _endoftext(m)
  out = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "bos_token_id": eot,
         "eos_token_id": eot} | dict(extra or {})
  activation = out.get("activation_function")  # the source's name when it means the same
  if _ACTIVATIONS.get(activation) != m.ffn:
    activation = _HF_ACTIVATION[m.ffn]
  inner = None if out.get("n_inner") is None and m.mlp_dim == 4 * m.d_model else m.mlp_dim
  out |= {"vocab_size": m.vocab_size - NUM_SPECIAL, "n_positions": m.max_len, "n_embd": m.d_model,
          "n_layer": m.num_decoder_layers, "n_head": m.num_heads, "n_inner": inner,
          "activation_function": activation,
          "layer_norm_epsilon": m.norm_eps, "resid_pdrop": m.dropout_rate,
          "embd_pdrop": m.dropout_rate, "attn_pdrop": m.attention_dropout_rate,
          "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
          "add_cross_attention": False, "tie_word_embeddings": m.tie_embeddings}
  require_unmapped_excluded(m, our_ids(out), NAME)
  return out


def workdir_config(hf: dict[str, Any], state: dict[str, np.ndarray], hf_tokenizer: str,
                   text_file: str = "", data_dir: str = "") -> Config:
  """The full config of a converted GPT-2: base.py's defaults, GPT-2's model, an 'hf' tokenizer,
  an LM over `text_file` (none if empty; prepared in `data_dir`) and greedy decoding."""
  cd = get_config()
  m = model_overrides(hf, state)
  cd.model.update(m)
  length = m["max_len"]
  cd.data.update(dataset="text_files" if text_file else "", text_file=text_file, data_dir=data_dir,
                 tokenizer="hf", source_tokenizer="", hf_tokenizer=hf_tokenizer,
                 hf_id_offset=ID_OFFSET, max_source_len=length, max_target_len=length,
                 batch_size=8, batching="pack")
  cd.train.update(optimizer="adamw", schedule="constant", learning_rate=1e-4, warmup_steps=0,
                  label_smoothing=0.0, grad_clip=1.0, b2=0.99, eps=1e-8)
  cd.eval.update(metrics="bpc", num_batches=20, num_decode_examples=0)
  cd.eval.decode.update(method="greedy", max_decode_len=min(64, length // 2))
  cd.checkpoint.update(keep_best_by="")
  return from_configdict(cd)


def _our_table(table: np.ndarray, hf: dict[str, Any]) -> np.ndarray:
  """A GPT-2 table [V, ...] (embedding or untied head) in our ids: each row at its `our_ids` place,
  the other NUM_SPECIAL rows copies of <|endoftext|>'s (the mean row without one; see the
  docstring)."""
  if table.shape[0] != hf["vocab_size"]:
    raise ConvertError(f"the GPT-2 weights have {table.shape[0]} vocabulary rows, config.json "
                       f"vocab_size={hf['vocab_size']}")
  eos_id = hf.get("eos_token_id")
  if isinstance(eos_id, int) and 0 <= eos_id < table.shape[0]:
    row = table[eos_id]
  else:
    row = table.mean(axis=0).astype(table.dtype)
  out = np.repeat(row[None], table.shape[0] + NUM_SPECIAL, axis=0)
  out[our_ids(hf)] = table
  return out


def params_from_hf(state: dict[str, np.ndarray], m: ModelConfig, hf: dict[str, Any],
                   tokenizer: Any = None) -> dict[str, Any]:
  """Our DecoderOnly parameters (unrolled layers) from a GPT2LMHeadModel state dict; every array
  is a reshaped, never recomputed, copy."""
  del tokenizer  # GPT-2's specials are in its config
  state = {k.removeprefix("transformer."): v for k, v in state.items()}
  n, h, d = m.num_heads, m.d_model // m.num_heads, m.d_model
  wte = state["wte.weight"]
  norm = lambda p: {"scale": state[f"{p}.weight"], "bias": state[f"{p}.bias"]}  # noqa: E731
  decoder: dict[str, Any] = {
      "position_embed": {"embedding": state["wpe.weight"]},
      "final_norm": norm("ln_f")}
  for i in range(m.num_decoder_layers):
    p = f"h.{i}"
    decoder[f"layers_{i}"] = {
        "attention_norm": norm(f"{p}.ln_1"),
        "self_attention": {
            "qkv": {"kernel": state[f"{p}.attn.c_attn.weight"].reshape(d, 3, n, h),
                    "bias": state[f"{p}.attn.c_attn.bias"].reshape(3, n, h)},
            "out": {"kernel": state[f"{p}.attn.c_proj.weight"].reshape(n, h, d),
                    "bias": state[f"{p}.attn.c_proj.bias"]}},
        "ffn_norm": norm(f"{p}.ln_2"),
        "ffn": {"wi": {"kernel": state[f"{p}.mlp.c_fc.weight"],
                       "bias": state[f"{p}.mlp.c_fc.bias"]},
                "wo": {"kernel": state[f"{p}.mlp.c_proj.weight"],
                       "bias": state[f"{p}.mlp.c_proj.bias"]}}}
  if not m.tie_embeddings:
    head = state["lm_head.weight"]  # [vocab, d]
    decoder["logits_dense"] = {"kernel": _our_table(head, hf).T}
  return {"token_embed": {"embedding": _our_table(wte, hf)},
          "decoder": decoder}


def hf_from_params(params: Any, m: ModelConfig, hf: dict[str, Any] | None = None
                   ) -> dict[str, np.ndarray]:
  """The GPT2LMHeadModel state dict (float32 numpy, `transformer.` prefixed) of our parameters;
  `hf` (the config.json written beside it) places <|endoftext|> (`our_ids`; None: no such id)."""
  d = m.d_model
  ours = our_ids({"vocab_size": m.vocab_size - NUM_SPECIAL} | {
      "eos_token_id": (hf or {}).get("eos_token_id")})
  dec = params["decoder"]
  out = {"transformer.wte.weight": np.asarray(params["token_embed"]["embedding"])[ours],
         "transformer.wpe.weight": dec["position_embed"]["embedding"]}

  def norm(name, p):
    out[f"transformer.{name}.weight"], out[f"transformer.{name}.bias"] = p["scale"], p["bias"]

  for i, layer in enumerate(stack_layers(dec, m.num_decoder_layers)):
    p = f"transformer.h.{i}"
    att, ffn = layer["self_attention"], layer["ffn"]
    norm(f"h.{i}.ln_1", layer["attention_norm"])
    norm(f"h.{i}.ln_2", layer["ffn_norm"])
    out[f"{p}.attn.c_attn.weight"] = np.reshape(att["qkv"]["kernel"], (d, 3 * d))
    out[f"{p}.attn.c_attn.bias"] = np.reshape(att["qkv"]["bias"], (3 * d,))
    out[f"{p}.attn.c_proj.weight"] = np.reshape(att["out"]["kernel"], (d, d))
    out[f"{p}.attn.c_proj.bias"] = att["out"]["bias"]
    out[f"{p}.mlp.c_fc.weight"], out[f"{p}.mlp.c_fc.bias"] = ffn["wi"]["kernel"], ffn["wi"]["bias"]
    out[f"{p}.mlp.c_proj.weight"] = ffn["wo"]["kernel"]
    out[f"{p}.mlp.c_proj.bias"] = ffn["wo"]["bias"]
  norm("ln_f", dec["final_norm"])
  if not m.tie_embeddings:
    out["lm_head.weight"] = np.asarray(dec["logits_dense"]["kernel"]).T[ours]
  return float32(out)


def describe_workdir(cfg: Config) -> str:
  m = cfg.model
  return (f"GPT-2 with {m.num_decoder_layers} layers, d_model {m.d_model}, vocabulary "
          f"{m.vocab_size} ({NUM_SPECIAL} ours + {m.vocab_size - NUM_SPECIAL}; never predicted: "
          f"{m.excluded_ids or 'none'})")


def describe_hf(hf: dict[str, Any]) -> str:
  return f"GPT-2 with {hf['n_layer']} layers, vocabulary {hf['vocab_size']}"
