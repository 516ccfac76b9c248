r"""T5 (`T5ForConditionalGeneration`: T5 v1.1, Flan-T5, the original T5) <-> our EncoderDecoder.

T5 in our knobs: encoder_decoder, pre-norm (`norm_position='pre'`) with RMSNorm without mean or
bias (`norm='rmsnorm'`, statistics in float32, `norm_eps` = layer_norm_epsilon, 1e-6), no biases
anywhere (`use_bias=False`), unscaled embeddings (`scale_embeddings=False`), one embedding table
for both stacks (`share_src_tgt_embeddings`), attention logits not scaled by 1/sqrt(head_dim)
(`scale_attention_logits=False`: T5 folds it into its initialisation), `head_dim` = d_kv (not
d_model / num_heads), `mlp_dim` = d_ff, and T5's bucketed relative position bias
(`positional='relative'`, `relative_num_buckets`, `relative_max_distance`): one [buckets, heads]
table per stack, which Hugging Face keeps in the first layer only (`block.0....relative_attention_
bias`) and whose bias every layer of the stack adds, as ours computes it once per stack and
passes it to every layer (the encoder's buckets bidirectional, the decoder's causal).
feed_forward_proj: "gated-gelu" (T5 v1.1, Flan-T5: tanh GELU, `gelu_new`) -> `ffn='geglu_tanh'`,
"gated-silu" -> swiglu, "relu" (the original T5) -> relu, "gelu" -> gelu; wi_0 is our `wi_gate`,
wi_1 our `wi_up`. The output head: T5 v1.1 / Flan-T5's untied lm_head -> `tie_embeddings=False`
(`logits_dense`); the original T5's tied one -> `tie_embeddings`, with its rescaling of the decoder
output by d_model**-0.5 (`scale_decoder_output`; Hugging Face's `scale_decoder_outputs`, which
transformers 5 writes; older config.json files say it with tie_word_embeddings). Whether the head is
tied is read from the weights (transformers 5 writes tie_word_embeddings=true for every T5; an
lm_head.weight that differs from shared.weight is an untied head). Torch Linear weights are
[out, in]: ours are their transposes, q/k/v [d, n*h] reshaped to [d, n, h] (self-attention's
fused `qkv` [d, 3, n, h], cross-attention's `query` and fused `kv` [d, 2, n, h]) and o to [n, h, d].
Dropout: dropout_rate -> model.dropout_rate, attention_dropout_rate and ffn_dropout_rate (T5
drops at all three places; ours does not drop after a stack's final norm; eval is unaffected);
export writes model.dropout_rate.

Token ids: ours = Hugging Face's (`data.hf_id_offset=0`), because T5's specials are where ours are:
pad 0 (our padding and the decoder's start token: T5's decoder_start_token_id is its pad), eos 1.
T5's <unk> (2) is our BOS id, never emitted by decoding nor by the pipelines; our UNK id 3 is
T5's "▁" piece, which our tokenizer never uses as unknown (T5's own <unk> is). So logits and the
whole vocabulary are T5's (every id of ours is T5's: `model.excluded_ids` is empty and the
softmax is T5's), greedy decoding stops where generate stops, and HF -> ours -> HF is bitwise
equal with no rows added or dropped.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from transformer.config import Config, from_configdict, ModelConfig
from transformer.schema import get_config
from transformer.convert.common import (ConvertError, float32, positive_ints, require,
                                        require_unmapped_excluded, stack_layers)
from transformer.data.tokenizers import EOS_ID, PAD_ID

MODEL_TYPE, NAME, ARCH = "t5", "T5", "encoder_decoder"
ID_OFFSET = 0
_FFN = {"gated-gelu": "geglu_tanh", "gated-silu": "swiglu", "relu": "relu", "gelu": "gelu"}
_HF_FFN = {v: k for k, v in _FFN.items()}
_GATED = ("geglu_tanh", "swiglu")
_MAX_LEN = 512  # T5 has no position table; our decoding cache needs a length


def head_is_tied(state: dict[str, np.ndarray]) -> bool:
  """No lm_head.weight, or one equal to shared.weight (a pytorch_model.bin stores both)."""
  head = state.get("lm_head.weight")
  return head is None or np.array_equal(head, _shared(state))


def _scales_output(hf: dict[str, Any]) -> bool:
  """Hugging Face's scale_decoder_outputs, or what an older config.json said by
  tie_word_embeddings."""
  if "scale_decoder_outputs" in hf:
    return bool(hf["scale_decoder_outputs"])
  return hf.get("tie_word_embeddings", True) is not False


def model_overrides(hf: dict[str, Any], state: dict[str, np.ndarray] | None = None
                    ) -> dict[str, Any]:
  """Our model config keys for a T5 config.json dict (and its weights, which say whether the
  head is tied); ConvertError names an unmappable key."""
  ids = {"pad_token_id": PAD_ID, "eos_token_id": EOS_ID, "decoder_start_token_id": PAD_ID}
  for key, want in ids.items():
    if hf.get(key, want) != want:
      raise ConvertError(f"config.json: {key}={hf[key]!r} has no counterpart here (ours is {want})")
  if hf.get("is_encoder_decoder", True) is not True:
    raise ConvertError(f"config.json: is_encoder_decoder={hf['is_encoder_decoder']!r} has no "
                       f"counterpart here (only T5ForConditionalGeneration)")
  positive_ints(hf, ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads"))
  ffn = hf.get("feed_forward_proj", "relu")
  if ffn not in _FFN:
    raise ConvertError(f"config.json: feed_forward_proj={ffn!r} is not one of {'|'.join(_FFN)}")
  if state is None:  # config-only checks: read_hf calls this before loading any weight
    tied = hf.get("tie_word_embeddings", True) is not False
  else:
    tied = head_is_tied(state)
  rate = float(hf.get("dropout_rate", 0.1))
  return dict(
      arch="encoder_decoder", vocab_size=hf["vocab_size"], source_vocab_size=hf["vocab_size"],
      excluded_ids="",
      d_model=hf["d_model"], num_heads=hf["num_heads"], num_kv_heads=0, head_dim=hf["d_kv"],
      v_head_dim=0, mlp_dim=hf["d_ff"], num_encoder_layers=hf["num_layers"],
      num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
      positional="relative", relative_num_buckets=int(hf.get("relative_attention_num_buckets", 32)),
      relative_max_distance=int(hf.get("relative_attention_max_distance", 128)),
      norm="rmsnorm", norm_position="pre", norm_eps=float(hf.get("layer_norm_epsilon", 1e-6)),
      ffn=_FFN[ffn], use_bias=False, scale_attention_logits=False,
      scale_decoder_output=_scales_output(hf), dropout_rate=rate, attention_dropout_rate=rate,
      ffn_dropout_rate=rate, tie_embeddings=tied, share_src_tgt_embeddings=True,
      scale_embeddings=False, prefix_lm=False, scan_layers=False, dtype="float32",
      param_dtype="float32", max_len=int(hf.get("n_positions") or _MAX_LEN))


def hf_config(m: ModelConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
  """The T5 config.json dict of model config `m`; ConvertError names the first key T5 lacks.

  `extra` (the source's config.json, for a converted run) gives the keys with no counterpart in
  ours (initializer factor, task prefixes, ...); architecture keys always come from `m`.
  """
  require(m, {"arch": "encoder_decoder", "positional": "relative", "norm": "rmsnorm",
              "norm_position": "pre", "use_bias": False, "scale_embeddings": False,
              "scale_attention_logits": False, "share_src_tgt_embeddings": True,
              "num_kv_heads": m.num_heads, "v_head_dim": m.head_dim,
              "source_vocab_size": m.vocab_size}, NAME)
  if m.ffn not in _HF_FFN:
    raise ConvertError(f"model.ffn={m.ffn!r} has no T5 counterpart (one of {'|'.join(_HF_FFN)})")
  require_unmapped_excluded(m, np.arange(m.vocab_size), NAME)  # T5's ids are ours
  out = {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"],
         "pad_token_id": PAD_ID, "eos_token_id": EOS_ID, "decoder_start_token_id": PAD_ID}
  out |= {k: v for k, v in (extra or {}).items() if k not in ("dense_act_fn", "is_gated_act")}
  out |= {"vocab_size": m.vocab_size, "d_model": m.d_model, "d_kv": m.head_dim, "d_ff": m.mlp_dim,
          "num_layers": m.num_encoder_layers, "num_decoder_layers": m.num_decoder_layers,
          "num_heads": m.num_heads, "relative_attention_num_buckets": m.relative_num_buckets,
          "relative_attention_max_distance": m.relative_max_distance,
          "layer_norm_epsilon": m.norm_eps, "dropout_rate": m.dropout_rate,
          "feed_forward_proj": _HF_FFN[m.ffn], "is_encoder_decoder": True,
          "tie_word_embeddings": m.tie_embeddings, "scale_decoder_outputs": m.scale_decoder_output}
  return out


def workdir_config(hf: dict[str, Any], state: dict[str, np.ndarray], hf_tokenizer: str,
                   text_file: str = "", data_dir: str = "") -> Config:
  """The full config of a converted T5: base.py's defaults, T5's model, its 'hf' tokenizer for both
  sides with ids as they are, no data (fine-tune with train.py --init_from) and greedy decoding."""
  if text_file:
    raise ConvertError("--text_file gives a language model data; a T5 workdir is converted "
                       "without data (train.py --init_from=OUT fine-tunes it on a seq2seq task)")
  del data_dir
  cd = get_config()
  m = model_overrides(hf, state)
  cd.model.update(m)
  length = min(64, m["max_len"])
  cd.data.update(dataset="", tokenizer="hf", source_tokenizer="", hf_tokenizer=hf_tokenizer,
                 hf_id_offset=ID_OFFSET, max_source_len=length, max_target_len=length,
                 batch_size=8, batching="pad")
  cd.train.update(optimizer="adafactor", schedule="constant", learning_rate=1e-3,
                  warmup_steps=0, label_smoothing=0.0, grad_clip=1.0)
  cd.eval.update(num_decode_examples=0)
  cd.eval.decode.update(method="greedy", max_decode_len=length)
  cd.checkpoint.update(keep_best_by="")
  return from_configdict(cd)


def _shared(state: dict[str, np.ndarray]) -> np.ndarray:
  for key in ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
    if key in state:
      return state[key]
  raise ConvertError("the T5 weights have no shared.weight (the embedding table)")


def _ffn_from_hf(state, p: str, m: ModelConfig) -> dict[str, Any]:
  w = lambda name: {"kernel": state[f"{p}.DenseReluDense.{name}.weight"].T}  # noqa: E731
  if m.ffn in _GATED:
    return {"wi_gate": w("wi_0"), "wi_up": w("wi_1"), "wo": w("wo")}
  return {"wi": w("wi"), "wo": w("wo")}


def params_from_hf(state: dict[str, np.ndarray], m: ModelConfig, hf: dict[str, Any],
                   tokenizer: Any = None) -> dict[str, Any]:
  """Our EncoderDecoder parameters (unrolled layers) from a T5ForConditionalGeneration state dict;
  every array is a transposed and reshaped, never recomputed, copy."""
  del hf, tokenizer  # T5's ids are ours
  d, n, h = m.d_model, m.num_heads, m.head_dim
  norm = lambda p: {"scale": state[f"{p}.weight"]}  # noqa: E731
  heads = lambda w: w.T.reshape(d, n, h)  # torch [n*h, d] -> ours [d, n, h]  # noqa: E731

  def attention(p: str, cross: bool) -> dict[str, Any]:
    q, k, v = (heads(state[f"{p}.{x}.weight"]) for x in "qkv")
    out = {"out": {"kernel": state[f"{p}.o.weight"].T.reshape(n, h, d)}}
    if cross:
      return out | {"query": {"kernel": q}, "kv": {"kernel": np.stack([k, v], axis=1)}}
    return out | {"qkv": {"kernel": np.stack([q, k, v], axis=1)}}

  def stack(name: str, num_layers: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "relative_bias": {"rel_embedding": state[
            f"{name}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]},
        "final_norm": norm(f"{name}.final_layer_norm")}
    for i in range(num_layers):
      p = f"{name}.block.{i}.layer"
      layer = {"attention_norm": norm(f"{p}.0.layer_norm"),
               "self_attention": attention(f"{p}.0.SelfAttention", cross=False)}
      if name == "decoder":
        layer |= {"cross_attention_norm": norm(f"{p}.1.layer_norm"),
                  "cross_attention": attention(f"{p}.1.EncDecAttention", cross=True)}
      f = 2 if name == "decoder" else 1
      layer |= {"ffn_norm": norm(f"{p}.{f}.layer_norm"), "ffn": _ffn_from_hf(state, f"{p}.{f}", m)}
      out[f"layers_{i}"] = layer
    return out

  params = {"token_embed": {"embedding": _shared(state)},
            "encoder": stack("encoder", m.num_encoder_layers),
            "decoder": stack("decoder", m.num_decoder_layers)}
  if not m.tie_embeddings:
    params["decoder"]["logits_dense"] = {"kernel": state["lm_head.weight"].T}
  return params


def hf_from_params(params: Any, m: ModelConfig, hf: dict[str, Any] | None = None
                   ) -> dict[str, np.ndarray]:
  """The T5ForConditionalGeneration state dict (float32 numpy) of our parameters: shared.weight
  once (Hugging Face ties the stacks' embed_tokens to it) and lm_head.weight when untied."""
  del hf  # m says all
  d, n, h = m.d_model, m.num_heads, m.head_dim
  out = {"shared.weight": params["token_embed"]["embedding"]}
  flat = lambda k: np.reshape(k, (d, n * h)).T  # ours [d, n, h] -> torch [n*h, d]  # noqa: E731

  def attention(p: str, att: dict[str, Any]) -> None:
    if "qkv" in att:
      q, k, v = (np.asarray(att["qkv"]["kernel"])[:, j] for j in range(3))
    else:
      q = att["query"]["kernel"]
      k, v = (np.asarray(att["kv"]["kernel"])[:, j] for j in range(2))
    for name, kernel in zip("qkv", (q, k, v)):
      out[f"{p}.{name}.weight"] = flat(kernel)
    out[f"{p}.o.weight"] = np.reshape(att["out"]["kernel"], (n * h, d)).T

  for name, num_layers in (("encoder", m.num_encoder_layers), ("decoder", m.num_decoder_layers)):
    stack = params[name]
    out[f"{name}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = (
        stack["relative_bias"]["rel_embedding"])
    out[f"{name}.final_layer_norm.weight"] = stack["final_norm"]["scale"]
    for i, layer in enumerate(stack_layers(stack, num_layers)):
      p = f"{name}.block.{i}.layer"
      out[f"{p}.0.layer_norm.weight"] = layer["attention_norm"]["scale"]
      attention(f"{p}.0.SelfAttention", layer["self_attention"])
      f = 1
      if name == "decoder":
        out[f"{p}.1.layer_norm.weight"] = layer["cross_attention_norm"]["scale"]
        attention(f"{p}.1.EncDecAttention", layer["cross_attention"])
        f = 2
      out[f"{p}.{f}.layer_norm.weight"] = layer["ffn_norm"]["scale"]
      ffn = layer["ffn"]
      names = ({"wi_0": "wi_gate", "wi_1": "wi_up", "wo": "wo"} if m.ffn in _GATED
               else {"wi": "wi", "wo": "wo"})
      for hf_name, ours in names.items():
        out[f"{p}.{f}.DenseReluDense.{hf_name}.weight"] = np.asarray(ffn[ours]["kernel"]).T
  if not m.tie_embeddings:
    out["lm_head.weight"] = np.asarray(params["decoder"]["logits_dense"]["kernel"]).T
  return float32(out)


def describe_workdir(cfg: Config) -> str:
  m = cfg.model
  return (f"T5 with {m.num_encoder_layers}+{m.num_decoder_layers} layers, d_model {m.d_model}, "
          f"vocabulary {m.vocab_size} (T5's ids), "
          f"{'tied' if m.tie_embeddings else 'untied'} head")


def describe_hf(hf: dict[str, Any]) -> str:
  return (f"T5 with {hf['num_layers']}+{hf['num_decoder_layers']} layers, vocabulary "
          f"{hf['vocab_size']}")
