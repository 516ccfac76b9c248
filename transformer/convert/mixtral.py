"""Mixtral (`MixtralForCausalLM`) <-> our DecoderOnly with a mixture-of-experts feed-forward.

Mixtral is the Llama family's decoder (convert/llama.py: vocabulary, attention, norms, RoPE,
Mistral's sliding window) whose feed-forward is model.ffn=moe: `num_local_experts` SwiGLU experts
of hidden `intermediate_size`, each token routed to `num_experts_per_tok` of them by a softmax over
all router logits, top-k, renormalised (model.moe_renormalize), nothing dropped
(model.moe_capacity_factor=0). The router `gate.weight` [E, d] is our `ffn/router/kernel`
transposed; expert j's w1, w3 [f, d] and w2 [d, f] are row j of our `wi_gate`, `wi_up` [E, d, f]
and `wo` [E, f, d], each transposed.

Files hold Mixtral's hub layout (`block_sparse_moe.experts.{j}.w1.weight`: what transformers'
save_pretrained writes, and what it loads); transformers' in-memory layout (`mlp.gate.weight`,
`mlp.experts.gate_up_proj` [E, 2f, d], `mlp.experts.down_proj` [E, d, f]) is read too.

Training: Hugging Face adds `router_aux_loss_coef` * its load-balancing loss only when
`output_router_logits` is true. Its loss is E * sum_e c_e * P_e with c_e the fraction of tokens
routing to e (the fractions sum to k) and P_e the mean router probability, both pooled over the
layers; ours (train.moe_balance_loss) is per layer, E * sum_e load_e * P_e with load_e a fraction
of the k * tokens assignments (summing to 1), summed over the L layers. One layer's is thus k times
ours; over L layers Hugging Face's is k / L times our sum when each expert's count is the same in
every layer (otherwise no fixed multiple), so train.moe_balance_loss = router_aux_loss_coef * k / L
(0 when output_router_logits is false) and back. Mixtral has no router z-loss: train.moe_z_loss=0.
"""

from typing import Any

import numpy as np

from transformer.config import Config, ModelConfig, TrainConfig
from transformer.convert import llama
from transformer.convert.common import (ConvertError, hf_choice, one, params_of, positive_ints,
                                        require_hf, stacked, state_of, transpose, Weight)
from transformer.convert.family import Family

MODEL_TYPE, NAME, ARCH = "mixtral", "Mixtral", "decoder_only"
ID_OFFSET = llama.ID_OFFSET
# Our model config keys the family fixes: set on import, required on export.
FIXED = llama.FIXED | dict(ffn="moe", moe_expert_ffn="swiglu", moe_capacity_factor=0.0,
                           moe_renormalize=True, moe_num_shared_experts=0, use_bias=False,
                           qkv_bias=False)
# config.json keys whose other values we lack: required on import, written on export.
HF_FIXED = llama.HF_FIXED | dict(router_jitter_noise=0.0)
_EXPERT = (("wi_gate", "w1"), ("wi_up", "w3"), ("wo", "w2"))


def model_overrides(hf: dict[str, Any], state: dict[str, np.ndarray] | None = None
                    ) -> dict[str, Any]:
  """Our model config keys for a Mixtral config.json dict (and its weights, which say whether
  the head is tied); ConvertError names an unmappable key."""
  hf_choice(hf, "model_type", MODEL_TYPE, {MODEL_TYPE: MODEL_TYPE})
  require_hf(hf, HF_FIXED)
  positive_ints(hf, ("num_local_experts", "num_experts_per_tok"))
  if hf["num_experts_per_tok"] > hf["num_local_experts"]:
    raise ConvertError(f"config.json: num_experts_per_tok={hf['num_experts_per_tok']} is more "
                       f"than num_local_experts={hf['num_local_experts']}")
  return llama.shared_overrides(hf, state) | FIXED | dict(
      moe_num_experts=hf["num_local_experts"], moe_top_k=hf["num_experts_per_tok"],
      sliding_window=llama.sliding_window_of(hf))


def train_overrides(hf: dict[str, Any]) -> dict[str, Any]:
  """Our train keys of Mixtral's training objective (see the module doc)."""
  coef = float(hf.get("router_aux_loss_coef", 0.0) or 0.0)
  if not hf.get("output_router_logits", False):
    coef = 0.0
  scale = hf["num_experts_per_tok"] / hf["num_hidden_layers"]
  return dict(moe_balance_loss=coef * scale, moe_z_loss=0.0)


def hf_training(t: TrainConfig, m: ModelConfig, out: dict[str, Any]) -> dict[str, Any]:
  """config.json's training keys of our train config, over `out`'s (see the module doc): a
  balance loss of 0 keeps the source's coefficient, switched off."""
  if t.moe_balance_loss == 0:
    return {"output_router_logits": False,
            "router_aux_loss_coef": out.get("router_aux_loss_coef", 0.0)}
  coef = t.moe_balance_loss * m.num_decoder_layers / m.moe_top_k
  return {"output_router_logits": True, "router_aux_loss_coef": _rounded(coef)}


def _rounded(x: float) -> float:
  """`x` to 12 significant digits: an imported coefficient exported again reads as it was."""
  return float(f"{x:.12g}")


def hf_config(m: ModelConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
  """The Mixtral config.json dict of `m` (over `extra`'s); ConvertError names a key Mixtral
  lacks."""
  out = llama.shared_hf_config(m, extra, MODEL_TYPE, FIXED)
  out.setdefault("output_router_logits", False)
  out.setdefault("router_aux_loss_coef", 0.0)
  return out | HF_FIXED | {
      "architectures": ["MixtralForCausalLM"], "num_local_experts": m.moe_num_experts,
      "num_experts_per_tok": m.moe_top_k, "sliding_window": m.sliding_window or None}


def exports(m: ModelConfig) -> bool:
  """Whether a decoder-only model config exports as Mixtral (RMSNorm and a mixture of experts)."""
  return m.norm == "rmsnorm" and m.ffn == "moe"


def workdir_config(hf: dict[str, Any], state: dict[str, np.ndarray], hf_tokenizer: str,
                   text_file: str = "", data_dir: str = "") -> Config:
  """The full config of a converted Mixtral, an LM over `text_file` if given."""
  return llama.decoder_config(model_overrides(hf, state), hf_tokenizer, text_file, data_dir,
                              train_overrides(hf))


def ffn_weights(m: ModelConfig, p: str, q: str) -> list[Weight]:
  """Layer prefix `p` / `q`: its router and its experts' stacked SwiGLU kernels."""
  moe = f"{q}.block_sparse_moe"
  weights = [one(f"{p}.ffn.router.kernel", f"{moe}.gate.weight", transpose, transpose)]
  for ours, theirs in _EXPERT:
    keys = tuple(f"{moe}.experts.{j}.{theirs}.weight" for j in range(m.moe_num_experts))
    weights.append(stacked(f"{p}.ffn.{ours}.kernel", keys, 0, transpose, transpose))
  return weights


def hub_layout(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """`state` with transformers' in-memory expert tensors in the hub's per-expert layout."""
  out = {}
  for key, value in state.items():
    head, _, tail = key.partition(".mlp.")
    if not tail:
      out[key] = value
    elif tail == "gate.weight":
      out[f"{head}.block_sparse_moe.gate.weight"] = value
    elif tail in ("experts.gate_up_proj", "experts.down_proj"):
      for j, row in enumerate(value):
        if tail == "experts.down_proj":
          out[f"{head}.block_sparse_moe.experts.{j}.w2.weight"] = row
        else:
          w1, w3 = np.split(row, 2, axis=0)
          out[f"{head}.block_sparse_moe.experts.{j}.w1.weight"] = w1
          out[f"{head}.block_sparse_moe.experts.{j}.w3.weight"] = w3
    else:
      out[key] = value
  return out


def params_from_hf(state: dict[str, np.ndarray], m: ModelConfig, hf: dict[str, Any],
                   tokenizer: Any = None) -> dict[str, Any]:
  """Our DecoderOnly parameters (unrolled layers) from a MixtralForCausalLM state dict."""
  del tokenizer  # the specials are in the config
  return params_of(hub_layout(state), llama.weights(m, hf, ffn=ffn_weights), FAMILY, m)


def hf_from_params(params: Any, m: ModelConfig, hf: dict[str, Any] | None = None
                   ) -> dict[str, np.ndarray]:
  """The MixtralForCausalLM state dict (float32 numpy, hub layout) of our parameters."""
  return state_of(params, llama.weights(m, hf, ffn=ffn_weights))


def describe_workdir(cfg: Config) -> str:
  m = cfg.model
  window = [f"sliding window {m.sliding_window}"] if m.sliding_window else []
  return llama.describe_shape(m, NAME, [f"{m.moe_num_experts} experts top-{m.moe_top_k}", *window])


def describe_hf(hf: dict[str, Any]) -> str:
  return (f"{NAME} with {hf['num_hidden_layers']} layers, {hf['num_local_experts']} experts, "
          f"vocabulary {hf['vocab_size']}")


FAMILY = Family(
    name=NAME, model_types=(MODEL_TYPE,), arch=ARCH, id_offset=ID_OFFSET, fixed=FIXED,
    hf_fixed=HF_FIXED, model_overrides=model_overrides, workdir_config=workdir_config,
    hf_config=hf_config, params_from_hf=params_from_hf, hf_from_params=hf_from_params,
    describe_workdir=describe_workdir, describe_hf=describe_hf,
    exports=exports, unused=llama.UNUSED, hf_training=hf_training,
    module=__name__)
