"""The parametrization (model.parametrization): `standard`, or `mup`, the maximal-update
parametrization for Adam (Yang et al. 2022, "Tensor Programs V"), written relative to a base
shape so that a model of d_model == model.mup_base_width is the standard one exactly.

With m = d_model / mup_base_width (every width of the ladder, d_model, mlp_dim and heads x
head_dim, grows by the same m) each parameter has a role, found from its path:

  role       what it is                                        init std         forward  Adam lr
  embedding  vocab, positions, relative-bias buckets, patches ->    std_sp*sqrt(m)*  x1       x1
             width (fan-in fixed)
  hidden     width -> width (attention q/k/v/out, FFN, MoE experts, std_sp           x1       x1/m
             head transform)
  readout    width -> fixed (logits, classifier, MoE router)        std_sp*sqrt(m)   x1/m     x1
  vector     norm scales and biases                                 std_sp           x1       x1

  * only the token embedding, whose standard std is d_model**-0.5; the other input tables and
    the patch projection already start at a width-free scale.

Beside these, attention logits take sqrt(h_base) / head_dim instead of 1/sqrt(head_dim) (h_base =
model.mup_base_head_dim, or head_dim / m: the head size at the base width), and the width-free
constants of the standard model that name d_model (scale_embeddings' sqrt(d_model), original T5's
d_model**-0.5 on the decoder output, the rsqrt schedule's d_model**-0.5) read the base width. The
learning-rate factors are one tree that the optax chain multiplies into the update just before
-lr (transformer/train/optim.py), so schedules, clipping, accumulation, EMA and traced members'
learning rates are untouched. Every factor of 1 is left out of the computation: a standard model,
and a µP model at its base width, compute what they always did, bit for bit.
"""

import dataclasses
import math
from typing import Any

from flax import traverse_util
import jax
import numpy as np

from transformer.config import ConfigError, ModelConfig

EMBEDDING, HIDDEN, READOUT, VECTOR = "embedding", "hidden", "readout", "vector"

# Modules whose kernel maps the width to the width (fan-in and fan-out grow with d_model).
HIDDEN_MODULES = frozenset({"qkv", "query", "key", "value", "kv", "out", "wi", "wi_gate", "wi_up",
                            "wo", "transform"})
# Modules whose kernel maps the width to a fixed size: their output takes the 1/m multiplier.
READOUT_MODULES = frozenset({"logits_dense", "classifier", "router"})
# Modules whose kernel maps a fixed size to the width (ViT's patch projection).
INPUT_MODULES = frozenset({"projection"})
# Leaves that are input tables or vectors, wherever they sit.
EMBEDDING_LEAVES = frozenset({"embedding", "rel_embedding", "class_token"})
VECTOR_LEAVES = frozenset({"scale", "bias"})
# The token embedding tables (layers.Embed), the ones scale_embeddings multiplies.
TOKEN_EMBEDDINGS = frozenset({"token_embed", "source_embed", "target_embed"})


def is_mup(cfg: ModelConfig) -> bool:
  """True when the model is µP-parametrized (model.parametrization='mup')."""
  return cfg.parametrization == "mup"


def width_ratio(cfg: ModelConfig) -> float:
  """m = d_model / model.mup_base_width under µP; 1 for the standard parametrization."""
  if not is_mup(cfg):
    return 1.0
  if cfg.mup_base_width <= 0:
    raise ConfigError("model.parametrization='mup' needs model.mup_base_width > 0 (the d_model "
                      "at which µP equals the standard parametrization)")
  return cfg.d_model / cfg.mup_base_width


def constants_width(cfg: ModelConfig) -> int:
  """The d_model that width-named constants read (sqrt(d_model) embedding scale, T5's decoder
  output scale, the rsqrt schedule): d_model, or under µP the base width (they stay fixed)."""
  return cfg.mup_base_width if is_mup(cfg) else cfg.d_model


def embedding_std(cfg: ModelConfig) -> float:
  """The token embedding's init std: d_model**-0.5 (standard), base width**-0.5 (µP)."""
  return constants_width(cfg)**-0.5


def readout_init_scale(cfg: ModelConfig) -> float:
  """The factor on a readout kernel's standard init std: sqrt(m) (1: standard)."""
  return math.sqrt(width_ratio(cfg))


def readout_multiplier(cfg: ModelConfig) -> float:
  """The factor on a readout's output (the logits, class logits, router logits): 1/m."""
  return 1.0 / width_ratio(cfg)


def base_head_dim(cfg: ModelConfig) -> float:
  """The query/key head size at the base width: model.mup_base_head_dim, or head_dim / m."""
  return cfg.mup_base_head_dim or cfg.head_dim / width_ratio(cfg)


def attention_scale(cfg: ModelConfig) -> float | None:
  """The attention logits' scale under µP, sqrt(h_base) / head_dim (times sqrt(head_dim) with
  model.scale_attention_logits=False, T5's unscaled logits); None: the standard scale."""
  h_base = base_head_dim(cfg)
  if not is_mup(cfg) or h_base == cfg.head_dim:
    return None
  standard = 1.0 / math.sqrt(cfg.head_dim) if cfg.scale_attention_logits else 1.0
  return standard * math.sqrt(h_base / cfg.head_dim)


def path_names(path: tuple[Any, ...]) -> list[str]:
  """The dict keys of a pytree path (a Partitioned box's attribute names no module)."""
  return [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]


def role(names: list[str]) -> str:
  """The role (EMBEDDING, HIDDEN, READOUT, VECTOR) of the parameter at `names` (its dict path);
  ValueError naming a kernel whose role is not declared here."""
  leaf = names[-1]
  parent = names[-2] if len(names) > 1 else ""
  if leaf in EMBEDDING_LEAVES:
    return EMBEDDING
  if leaf in VECTOR_LEAVES:
    return VECTOR
  if leaf == "kernel":
    if parent in HIDDEN_MODULES:
      return HIDDEN
    if parent in READOUT_MODULES:
      return READOUT
    if parent in INPUT_MODULES:
      return EMBEDDING
  raise ValueError(f"parameter {'/'.join(names)}: its µP role is not declared in "
                   "transformer/model/parametrization.py")


def learning_rate_factor(cfg: ModelConfig, names: list[str]) -> float:
  """The Adam learning-rate factor of the parameter at `names`: 1/m for hidden matrices, else 1."""
  return 1.0 / width_ratio(cfg) if role(names) == HIDDEN else 1.0


def learning_rate_factors(cfg: ModelConfig, params: Any) -> Any:
  """A pytree of `params`' structure of float learning-rate factors (see the module doc)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: learning_rate_factor(cfg, path_names(path)), params)


def _fold_factors(cfg: ModelConfig) -> dict[str, float]:
  """What folding µP into a standard model multiplies: the readout kernels, the query
  projections (the attention scale's ratio) and the token embedding (scale_embeddings)."""
  m = width_ratio(cfg)
  readout = 1.0 / m * (math.sqrt(m) if cfg.scale_decoder_output else 1.0)
  standard = 1.0 / math.sqrt(cfg.head_dim) if cfg.scale_attention_logits else 1.0
  query = (attention_scale(cfg) or standard) / standard
  embedding = 1.0 / math.sqrt(m) if cfg.scale_embeddings else 1.0
  return {"readout": readout, "query": query, "embedding": embedding}


def to_standard(cfg: ModelConfig, params: Any) -> tuple[ModelConfig, Any]:
  """(the standard-parametrization config, params with µP's multipliers folded in): the same
  function of the inputs. ConfigError for tied embeddings off the base width (one table cannot
  take the input's factor and the logits' 1/m)."""
  if not is_mup(cfg):
    return cfg, params
  factors = _fold_factors(cfg)
  if cfg.tie_embeddings and (factors["readout"] != 1.0 or factors["embedding"] != 1.0):
    raise ConfigError(f"model.parametrization='mup' with model.tie_embeddings=True at d_model="
                      f"{cfg.d_model} != model.mup_base_width={cfg.mup_base_width}: the logits' "
                      "multiplier cannot be folded into the shared embedding (train untied "
                      "embeddings to export)")
  standard = dataclasses.replace(cfg, parametrization="standard", mup_base_width=0,
                                 mup_base_head_dim=0)
  return standard, _fold(params, factors)


def _fold(params: Any, factors: dict[str, float]) -> Any:
  """params with each kernel scaled by its fold factor (q of a fused qkv: index 0 of its axis)."""
  flat = traverse_util.flatten_dict(params)
  for path, value in flat.items():
    leaf, parent = path[-1], path[-2] if len(path) > 1 else ""
    x = np.asarray(value)
    if parent in READOUT_MODULES and leaf == "kernel" and factors["readout"] != 1.0:
      flat[path] = x * np.asarray(factors["readout"], x.dtype)
    elif parent == "query" and factors["query"] != 1.0:
      flat[path] = x * np.asarray(factors["query"], x.dtype)
    elif parent == "qkv" and factors["query"] != 1.0:  # [.., d, 3, n, h] / bias [.., 3, n, h]
      flat[path] = x.copy()
      flat[path][..., 0, :, :] *= np.asarray(factors["query"], x.dtype)
    elif parent in TOKEN_EMBEDDINGS and leaf == "embedding" and factors["embedding"] != 1.0:
      flat[path] = x * np.asarray(factors["embedding"], x.dtype)
  return traverse_util.unflatten_dict(flat)
