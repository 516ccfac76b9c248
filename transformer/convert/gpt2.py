"""GPT-2 (`GPT2LMHeadModel`) <-> our DecoderOnly: configs and weights.

GPT-2 is our decoder_only with pre-LN and a final LayerNorm, learned positions, biases, tanh GELU
and a tied head; its Conv1D c_attn weight [d, 3d] is our fused `qkv` kernel [d, 3, n, h] reshaped.
Ids: ours = GPT-2's + 4 (`data.hf_id_offset`: our 0 is padding, GPT-2's is "!"), except
<|endoftext|>, whose place is our EOS, where decoding stops as generate stops (`our_ids`). Our ids
in no GPT-2 id's place are `model.excluded_ids`; their embedding rows copy <|endoftext|>'s, so the
start token 0 reads as what GPT-2 saw before every document.
"""

from typing import Any

import numpy as np

from transformer.config import Config, ModelConfig
from transformer.convert.common import (CONVERTED, converted_config, ConvertError, dense, hf_choice,
                                        hf_ffn, norm, one, params_of, positive_ints, require,
                                        require_hf, require_unmapped_excluded, reshaped,
                                        shifted_eos, shifted_ids, shifted_table, start_embedding_id,
                                        state_of, unmapped_ids, Weight)
from transformer.convert.family import Family
from transformer.data.tokenizers import NUM_SPECIAL

MODEL_TYPE, NAME, ARCH = "gpt2", "GPT-2", "decoder_only"
ID_OFFSET = NUM_SPECIAL
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                "relu": "relu"}
# Our model config keys GPT-2 fixes: set on import, required on export.
FIXED = dict(arch="decoder_only", positional="learned", norm="layernorm", norm_position="pre",
             use_bias=True, scale_embeddings=False, scale_attention_logits=True,
             scale_decoder_output=False, ffn_dropout_rate=0.0)
# config.json keys whose other values we lack: required on import, written on export.
HF_FIXED = dict(scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                add_cross_attention=False)


def our_ids(hf: dict[str, Any]) -> np.ndarray:
  """Our id of each GPT-2 id of a config.json dict: id + NUM_SPECIAL, <|endoftext|> our EOS."""
  return shifted_ids(hf)


def model_overrides(hf: dict[str, Any], state: dict[str, np.ndarray] | None = None
                    ) -> dict[str, Any]:
  """Our model config keys for a GPT-2 config.json dict; ConvertError names an unmappable key."""
  del state  # GPT-2's config says all
  require_hf(hf, HF_FIXED)
  positive_ints(hf, ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"))
  ffn = hf_choice(hf, "activation_function", "gelu_new", _ACTIVATIONS)
  d, heads = hf["n_embd"], hf["n_head"]
  tied = bool(hf.get("tie_word_embeddings", True))
  return CONVERTED | FIXED | dict(
      vocab_size=hf["vocab_size"] + NUM_SPECIAL,
      excluded_ids=unmapped_ids(our_ids(hf), hf["vocab_size"] + NUM_SPECIAL),
      source_vocab_size=hf["vocab_size"] + NUM_SPECIAL,  # as training fills it in for an LM
      d_model=d, num_heads=heads, head_dim=0, mlp_dim=hf.get("n_inner") or 4 * d,
      num_encoder_layers=0, num_decoder_layers=hf["n_layer"], ffn=ffn,
      norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
      dropout_rate=float(hf.get("resid_pdrop", 0.1)),
      attention_dropout_rate=float(hf.get("attn_pdrop", 0.1)),
      tie_embeddings=tied, max_len=hf["n_positions"],
      start_embedding_id=start_embedding_id(hf, our_ids(hf), tied))


def hf_config(m: ModelConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
  """The GPT-2 config.json dict of `m` (over `extra`'s); ConvertError names a key GPT-2 lacks."""
  if m.d_model % m.num_heads:
    raise ConvertError(f"model.head_dim={m.head_dim} has no GPT-2 counterpart (GPT-2's is "
                       f"d_model / num_heads, and model.num_heads={m.num_heads} does not divide "
                       f"model.d_model={m.d_model})")
  h = m.d_model // m.num_heads
  require(m, FIXED | {"num_kv_heads": m.num_heads, "head_dim": h, "v_head_dim": h}, NAME)
  activation = hf_ffn(m, (extra or {}).get("activation_function"), _ACTIVATIONS, NAME)
  eot = shifted_eos(m)  # <|endoftext|>
  out = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "bos_token_id": eot,
         "eos_token_id": eot} | dict(extra or {})
  inner = None if out.get("n_inner") is None and m.mlp_dim == 4 * m.d_model else m.mlp_dim
  out |= {"vocab_size": m.vocab_size - NUM_SPECIAL, "n_positions": m.max_len, "n_embd": m.d_model,
          "n_layer": m.num_decoder_layers, "n_head": m.num_heads, "n_inner": inner,
          "activation_function": activation,
          "layer_norm_epsilon": m.norm_eps, "resid_pdrop": m.dropout_rate,
          "embd_pdrop": m.dropout_rate, "attn_pdrop": m.attention_dropout_rate,
          "tie_word_embeddings": m.tie_embeddings} | HF_FIXED
  require_unmapped_excluded(m, our_ids(out), NAME)
  return out


def workdir_config(hf: dict[str, Any], state: dict[str, np.ndarray], hf_tokenizer: str,
                   text_file: str = "", data_dir: str = "") -> Config:
  """The full config of a converted GPT-2, an LM over `text_file` if given."""
  m = model_overrides(hf, state)
  length = m["max_len"]
  return converted_config(
      m, hf_tokenizer, ID_OFFSET, length,
      data=dict(dataset="text_files" if text_file else "", text_file=text_file,
                data_dir=data_dir, batching="pack"),
      train=dict(optimizer="adamw", learning_rate=1e-4, b2=0.99, eps=1e-8),
      evaluation=dict(metrics="bpc", num_batches=20), decode_len=min(64, length // 2))


def _our_table(table: np.ndarray, hf: dict[str, Any]) -> np.ndarray:
  """A GPT-2 table [V, ...] in our ids: each row at its `our_ids` place, the others copies of
  <|endoftext|>'s (the mean row without one)."""
  return shifted_table(table, hf, NAME, ("eos_token_id",))


def _weights(m: ModelConfig, hf: dict[str, Any] | None) -> list[Weight]:
  """Our DecoderOnly's parameters and GPT-2's tensors (without their `transformer.` prefix)."""
  n, d = m.num_heads, m.d_model
  h = d // n
  ours = our_ids({"vocab_size": m.vocab_size - NUM_SPECIAL,
                  "eos_token_id": (hf or {}).get("eos_token_id")})
  weights = [one("token_embed.embedding", "wte.weight", lambda x: _our_table(x, hf),
                 lambda x: np.asarray(x)[ours]),
             one("decoder.position_embed.embedding", "wpe.weight"),
             *norm("decoder.final_norm", "ln_f")]
  for i in range(m.num_decoder_layers):
    p, q = f"decoder.layers_{i}", f"h.{i}"
    weights += [
        *norm(f"{p}.attention_norm", f"{q}.ln_1"),
        one(f"{p}.self_attention.qkv.kernel", f"{q}.attn.c_attn.weight", reshaped(d, 3, n, h),
            reshaped(d, 3 * d)),
        one(f"{p}.self_attention.qkv.bias", f"{q}.attn.c_attn.bias", reshaped(3, n, h),
            reshaped(3 * d)),
        *dense(f"{p}.self_attention.out", f"{q}.attn.c_proj", reshaped(n, h, d), reshaped(d, d)),
        *norm(f"{p}.ffn_norm", f"{q}.ln_2"),
        *dense(f"{p}.ffn.wi", f"{q}.mlp.c_fc"), *dense(f"{p}.ffn.wo", f"{q}.mlp.c_proj")]
  if not m.tie_embeddings:
    weights.append(one("decoder.logits_dense.kernel", "lm_head.weight",
                       lambda x: _our_table(x, hf).T, lambda x: np.asarray(x).T[ours]))
  return weights


def params_from_hf(state: dict[str, np.ndarray], m: ModelConfig, hf: dict[str, Any],
                   tokenizer: Any = None) -> dict[str, Any]:
  """Our DecoderOnly parameters (unrolled layers) from a GPT2LMHeadModel state dict."""
  del tokenizer  # GPT-2's specials are in its config
  return params_of({k.removeprefix("transformer."): v for k, v in state.items()}, _weights(m, hf),
                   FAMILY, m)


def hf_from_params(params: Any, m: ModelConfig, hf: dict[str, Any] | None = None
                   ) -> dict[str, np.ndarray]:
  """The GPT2LMHeadModel state dict (float32 numpy) of our parameters, `hf` its config.json."""
  state = state_of(params, _weights(m, hf))
  return {k if k == "lm_head.weight" else f"transformer.{k}": v for k, v in state.items()}


def describe_workdir(cfg: Config) -> str:
  m = cfg.model
  return (f"GPT-2 with {m.num_decoder_layers} layers, d_model {m.d_model}, vocabulary "
          f"{m.vocab_size} ({NUM_SPECIAL} ours + {m.vocab_size - NUM_SPECIAL}; never predicted: "
          f"{m.excluded_ids or 'none'})")


def describe_hf(hf: dict[str, Any]) -> str:
  return f"GPT-2 with {hf['n_layer']} layers, vocabulary {hf['vocab_size']}"


FAMILY = Family(
    name=NAME, model_types=(MODEL_TYPE,), arch=ARCH, id_offset=ID_OFFSET, fixed=FIXED,
    hf_fixed=HF_FIXED, model_overrides=model_overrides, workdir_config=workdir_config,
    hf_config=hf_config, params_from_hf=params_from_hf, hf_from_params=hf_from_params,
    describe_workdir=describe_workdir, describe_hf=describe_hf,
    # A decoder without RMSNorm (one with it is the Llama family's or Mixtral's).
    exports=lambda m: m.norm != "rmsnorm",
    # The causal-mask buffers older files hold; lm_head.weight of a tied head (wte's copy).
    unused=(r"h\.\d+\.attn\.(masked_)?bias", r"lm_head\.weight"),
    module=__name__)
