"""T5 (`T5ForConditionalGeneration`: T5 v1.1, Flan-T5, the original T5) <-> our EncoderDecoder.

T5 is our encoder_decoder with pre-norm RMSNorm, no biases, one shared unscaled embedding,
unscaled attention logits (T5 folds 1/sqrt(head_dim) into its initialisation) and one relative
position bias table per stack (in Hugging Face's first layer). The original T5's tied head scales
the decoder output by d_model**-0.5 (`scale_decoder_output`); the weights say whether the head is
tied (transformers 5 writes tie_word_embeddings=true for every T5). Ids: ours are T5's (pad 0,
eos 1; T5's <unk> is our BOS and our UNK its "▁", neither of which our pipelines emit).
"""

from typing import Any

import numpy as np

from transformer import choices
from transformer.config import Config, ModelConfig
from transformer.convert.common import (CONVERTED, converted_config, ConvertError, first_of,
                                        hf_choice, hf_ffn, norm, one, params_of, positive_ints,
                                        require, require_hf, require_unmapped_excluded, stacked,
                                        state_of, transpose, Weight)
from transformer.convert.family import Family
from transformer.data.tokenizers import EOS_ID, PAD_ID

MODEL_TYPE, NAME, ARCH = "t5", "T5", "encoder_decoder"
ID_OFFSET = 0
_FFN = {"gated-gelu": "geglu_tanh", "gated-silu": "swiglu", "relu": "relu", "gelu": "gelu"}
# Our model config keys T5 fixes: set on import, required on export.
FIXED = dict(arch="encoder_decoder", positional="relative", norm="rmsnorm", norm_position="pre",
             use_bias=False, scale_embeddings=False, scale_attention_logits=False,
             share_src_tgt_embeddings=True)
# config.json keys whose other values we lack: required on import, written on export.
HF_FIXED = dict(pad_token_id=PAD_ID, eos_token_id=EOS_ID, decoder_start_token_id=PAD_ID,
                is_encoder_decoder=True)
_MAX_LEN = 512  # T5 has no position table; our decoding cache needs a length


def model_overrides(hf: dict[str, Any], state: dict[str, np.ndarray] | None = None
                    ) -> dict[str, Any]:
  """Our model config keys for a T5 config.json dict (and its weights, which say whether the
  head is tied); ConvertError names an unmappable key."""
  require_hf(hf, HF_FIXED)
  positive_ints(hf, ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads"))
  ffn = hf_choice(hf, "feed_forward_proj", "relu", _FFN)
  # Without weights (read_hf checks the config before loading any), the config says; older
  # config.jsons said by it whether the output is scaled. Tied: no lm_head.weight, or one equal
  # to shared.weight (a pytorch_model.bin stores both).
  said_tied = hf.get("tie_word_embeddings", True) is not False
  head = None if state is None else state.get("lm_head.weight")
  tied = said_tied if state is None else head is None or np.array_equal(head, _shared(state))
  rate = float(hf.get("dropout_rate", 0.1))
  return CONVERTED | FIXED | dict(
      vocab_size=hf["vocab_size"], source_vocab_size=hf["vocab_size"], excluded_ids="",
      d_model=hf["d_model"], num_heads=hf["num_heads"], head_dim=hf["d_kv"], mlp_dim=hf["d_ff"],
      num_encoder_layers=hf["num_layers"],
      num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
      relative_num_buckets=int(hf.get("relative_attention_num_buckets", 32)),
      relative_max_distance=int(hf.get("relative_attention_max_distance", 128)),
      norm_eps=float(hf.get("layer_norm_epsilon", 1e-6)), ffn=ffn,
      scale_decoder_output=bool(hf.get("scale_decoder_outputs", said_tied)), dropout_rate=rate,
      attention_dropout_rate=rate, ffn_dropout_rate=rate, tie_embeddings=tied,
      max_len=int(hf.get("n_positions") or _MAX_LEN))


def hf_config(m: ModelConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
  """The T5 config.json dict of `m` (over `extra`'s); ConvertError names a key T5 lacks."""
  require(m, FIXED | {"num_kv_heads": m.num_heads, "v_head_dim": m.head_dim,
                      "source_vocab_size": m.vocab_size}, NAME)
  feed_forward_proj = hf_ffn(m, None, _FFN, NAME)
  require_unmapped_excluded(m, np.arange(m.vocab_size), NAME)  # T5's ids are ours
  out = {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]} | {
      k: v for k, v in (extra or {}).items() if k not in ("dense_act_fn", "is_gated_act")}
  return out | {"vocab_size": m.vocab_size, "d_model": m.d_model, "d_kv": m.head_dim,
                "d_ff": m.mlp_dim, "num_layers": m.num_encoder_layers,
                "num_decoder_layers": m.num_decoder_layers, "num_heads": m.num_heads,
                "relative_attention_num_buckets": m.relative_num_buckets,
                "relative_attention_max_distance": m.relative_max_distance,
                "layer_norm_epsilon": m.norm_eps, "dropout_rate": m.dropout_rate,
                "feed_forward_proj": feed_forward_proj, "tie_word_embeddings": m.tie_embeddings,
                "scale_decoder_outputs": m.scale_decoder_output} | HF_FIXED


def workdir_config(hf: dict[str, Any], state: dict[str, np.ndarray], hf_tokenizer: str,
                   text_file: str = "", data_dir: str = "") -> Config:
  """The full config of a converted T5, without data (train.py --init_from fine-tunes it)."""
  if text_file:
    raise ConvertError("--text_file gives a language model data; a T5 workdir is converted "
                       "without data (train.py --init_from=OUT fine-tunes it on a seq2seq task)")
  del data_dir
  m = model_overrides(hf, state)
  length = min(64, m["max_len"])
  return converted_config(m, hf_tokenizer, ID_OFFSET, length, data=dict(dataset="", batching="pad"),
                          train=dict(optimizer="adafactor", learning_rate=1e-3), evaluation={},
                          decode_len=length)


def _shared(state: dict[str, np.ndarray]) -> np.ndarray:
  return first_of(state, ("shared.weight", "encoder.embed_tokens.weight",
                          "decoder.embed_tokens.weight"), NAME)


def _weights(m: ModelConfig) -> list[Weight]:
  """Our EncoderDecoder's parameters and T5's tensors."""
  d, n, h = m.d_model, m.num_heads, m.head_dim
  to_heads = lambda w: w.T.reshape(d, n, h)  # torch [n*h, d] -> ours [d, n, h]  # noqa: E731
  from_heads = lambda k: np.reshape(k, (d, n * h)).T  # noqa: E731
  gated = choices.FFNS[m.ffn].gated
  ffn = {"wi_0": "wi_gate", "wi_1": "wi_up", "wo": "wo"} if gated else {"wi": "wi", "wo": "wo"}

  def attention(p: str, a: str, cross: bool) -> list[Weight]:
    q, k, v = (f"{a}.{x}.weight" for x in "qkv")
    out = one(f"{p}.out.kernel", f"{a}.o.weight", lambda w: w.T.reshape(n, h, d),
              lambda x: np.reshape(x, (n * h, d)).T)
    if cross:
      return [one(f"{p}.query.kernel", q, to_heads, from_heads),
              stacked(f"{p}.kv.kernel", (k, v), 1, to_heads, from_heads), out]
    return [stacked(f"{p}.qkv.kernel", (q, k, v), 1, to_heads, from_heads), out]

  weights = [Weight("token_embed.embedding", _shared, lambda x: {"shared.weight": x})]
  for name, num_layers in (("encoder", m.num_encoder_layers), ("decoder", m.num_decoder_layers)):
    weights += [one(f"{name}.relative_bias.rel_embedding",
                    f"{name}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
                *norm(f"{name}.final_norm", f"{name}.final_layer_norm", bias=False)]
    for i in range(num_layers):
      p, q = f"{name}.layers_{i}", f"{name}.block.{i}.layer"
      weights += [*norm(f"{p}.attention_norm", f"{q}.0.layer_norm", bias=False),
                  *attention(f"{p}.self_attention", f"{q}.0.SelfAttention", cross=False)]
      if name == "decoder":
        weights += [*norm(f"{p}.cross_attention_norm", f"{q}.1.layer_norm", bias=False),
                    *attention(f"{p}.cross_attention", f"{q}.1.EncDecAttention", cross=True)]
      f = 2 if name == "decoder" else 1
      weights += norm(f"{p}.ffn_norm", f"{q}.{f}.layer_norm", bias=False)
      weights += [one(f"{p}.ffn.{ours}.kernel", f"{q}.{f}.DenseReluDense.{hf_name}.weight",
                      transpose, transpose) for hf_name, ours in ffn.items()]
  if not m.tie_embeddings:
    weights.append(one("decoder.logits_dense.kernel", "lm_head.weight", transpose, transpose))
  return weights


def params_from_hf(state: dict[str, np.ndarray], m: ModelConfig, hf: dict[str, Any],
                   tokenizer: Any = None) -> dict[str, Any]:
  """Our EncoderDecoder parameters (unrolled layers) from a T5 state dict."""
  del hf, tokenizer  # T5's ids are ours
  return params_of(state, _weights(m), FAMILY, m)


def hf_from_params(params: Any, m: ModelConfig, hf: dict[str, Any] | None = None
                   ) -> dict[str, np.ndarray]:
  """The T5ForConditionalGeneration state dict (float32 numpy) of our parameters."""
  del hf  # m says all
  return state_of(params, _weights(m))


def describe_workdir(cfg: Config) -> str:
  m = cfg.model
  return (f"T5 with {m.num_encoder_layers}+{m.num_decoder_layers} layers, d_model {m.d_model}, "
          f"vocabulary {m.vocab_size} (T5's ids), "
          f"{'tied' if m.tie_embeddings else 'untied'} head")


def describe_hf(hf: dict[str, Any]) -> str:
  return (f"T5 with {hf['num_layers']}+{hf['num_decoder_layers']} layers, vocabulary "
          f"{hf['vocab_size']}")


FAMILY = Family(
    name=NAME, model_types=(MODEL_TYPE,), arch=ARCH, id_offset=ID_OFFSET, fixed=FIXED,
    hf_fixed=HF_FIXED, model_overrides=model_overrides, workdir_config=workdir_config,
    hf_config=hf_config, params_from_hf=params_from_hf, hf_from_params=hf_from_params,
    describe_workdir=describe_workdir, describe_hf=describe_hf,
    # The stacks' copies of shared.weight; lm_head.weight of a tied head (equal to it); the
    # cross-attention bias table older files hold, which T5 never reads.
    unused=(r"(encoder|decoder)\.embed_tokens\.weight", r"lm_head\.weight",
            r"decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight"),
    module=__name__)
