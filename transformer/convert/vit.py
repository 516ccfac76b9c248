"""ViT (`ViTForImageClassification`) <-> our EncoderOnly reading images (model.image_size > 0).

ViT is our encoder_only with head=classify on a class token (pooling=class_token, head_bias),
pre-LN with a final norm, learned positions over the class token and the patches (max_len =
patches + 1), biases everywhere, hidden_act as `ffn` and layer_norm_eps (1e-12) as norm_eps.
Its patch embedding is a Conv2d over NCHW pixels with kernel = stride = patch: the same linear
map of each patch as our kernel [p p C, d] over patches flattened (row, column, channel), the
conv weight [d, C, p, p] permuted. Classes: ours are the label tokenizer's ids, NUM_SPECIAL + the
Hugging Face label; the 4 reserved ids get zero weights and a bias of heads.EXCLUDED_LOGIT (their
probability is exactly 0), and export drops them. Pixels: both models read the same normalised
values (our images are channels last, Hugging Face's channels first).
"""

from typing import Any

import numpy as np

from transformer.config import Config, from_configdict, ModelConfig
from transformer.convert.common import (CONVERTED, ConvertError, dense, encoder_layer, hf_choice,
                                        hf_ffn, norm, one, params_of, positive_ints, require,
                                        require_hf, reshaped, state_of, Weight)
from transformer.convert.family import Family
from transformer.data import tokenizers
from transformer.data.tokenizers import NUM_SPECIAL
from transformer.model.heads import EXCLUDED_LOGIT
from transformer.schema import get_config

MODEL_TYPE, NAME, ARCH = "vit", "ViT", "encoder_only"
ID_OFFSET = NUM_SPECIAL
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "relu": "relu"}
# Our model config keys ViT fixes: set on import, required on export.
FIXED = dict(arch="encoder_only", head="classify", pooling="class_token", head_bias=True,
             positional="learned", norm="layernorm", norm_position="pre", use_bias=True,
             embedding_norm=False, scale_attention_logits=True, ffn_dropout_rate=0.0)
# config.json keys whose other values we lack: required on import, written on export.
HF_FIXED = dict(qkv_bias=True)


def _patches(image_size: int, patch_size: int) -> int:
  return (image_size // patch_size) ** 2


def label_names(hf: dict[str, Any]) -> list[str]:
  """The class names of a config.json (id2label in label order; LABEL_i where it has none)."""
  id2label = {int(k): str(v) for k, v in (hf.get("id2label") or {}).items()}
  count = int(hf.get("num_labels") or len(id2label) or 2)
  return [id2label.get(i, f"LABEL_{i}").replace(" ", "_") for i in range(count)]


def label_tokenizer(hf: dict[str, Any]) -> tokenizers.Tokenizer:
  """Our label tokenizer of a ViT: its class names, label i at id NUM_SPECIAL + i."""
  try:
    return tokenizers.SymbolTokenizer(label_names(hf))
  except ValueError as e:
    raise ConvertError(f"config.json: id2label: {e}") from None


def model_overrides(hf: dict[str, Any], state: dict[str, np.ndarray] | None = None
                    ) -> dict[str, Any]:
  """Our model config keys for a ViT config.json dict; ConvertError names an unmappable key."""
  del state  # the config says all
  require_hf(hf, HF_FIXED)
  positive_ints(hf, ("hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "image_size", "patch_size", "num_channels"))
  ffn = hf_choice(hf, "hidden_act", "gelu", _ACTIVATIONS)
  d, heads, size, patch = hf["hidden_size"], hf["num_attention_heads"], hf["image_size"], \
      hf["patch_size"]
  if d % heads:
    raise ConvertError(f"config.json: num_attention_heads={heads} does not divide "
                       f"hidden_size={d}")
  if size % patch:
    raise ConvertError(f"config.json: patch_size={patch} does not divide image_size={size}")
  return CONVERTED | FIXED | dict(
      vocab_size=1, source_vocab_size=1, num_classes=NUM_SPECIAL + len(label_names(hf)),
      d_model=d, num_heads=heads, head_dim=0, mlp_dim=hf["intermediate_size"],
      num_encoder_layers=hf["num_hidden_layers"], num_decoder_layers=0, ffn=ffn,
      norm_eps=float(hf.get("layer_norm_eps", 1e-12)), image_size=size, patch_size=patch,
      image_channels=hf["num_channels"], max_len=_patches(size, patch) + 1,
      dropout_rate=float(hf.get("hidden_dropout_prob", 0.0)),
      attention_dropout_rate=float(hf.get("attention_probs_dropout_prob", 0.0)))


def hf_config(m: ModelConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
  """The ViT config.json dict of `m` (over `extra`'s); ConvertError names a key ViT lacks."""
  if m.d_model % m.num_heads:
    raise ConvertError(f"model.num_heads={m.num_heads} does not divide model.d_model="
                       f"{m.d_model}, as ViT's heads must")
  h = m.d_model // m.num_heads
  require(m, FIXED | {"num_kv_heads": m.num_heads, "head_dim": h, "v_head_dim": h,
                      "max_len": _patches(m.image_size, m.patch_size) + 1}, NAME)
  activation = hf_ffn(m, (extra or {}).get("hidden_act"), _ACTIVATIONS, NAME)
  labels = m.num_classes - NUM_SPECIAL
  if labels < 1:
    raise ConvertError(f"model.num_classes={m.num_classes} leaves no ViT labels (ids below "
                       f"{NUM_SPECIAL} are ours)")
  out = {"model_type": "vit", "architectures": ["ViTForImageClassification"],
         "encoder_stride": m.patch_size} | dict(extra or {})
  names = label_names(out) if len(out.get("id2label") or {}) == labels else [
      f"LABEL_{i}" for i in range(labels)]
  return out | {"hidden_size": m.d_model, "num_hidden_layers": m.num_encoder_layers,
                "num_attention_heads": m.num_heads, "intermediate_size": m.mlp_dim,
                "hidden_act": activation, "layer_norm_eps": m.norm_eps,
                "hidden_dropout_prob": m.dropout_rate,
                "attention_probs_dropout_prob": m.attention_dropout_rate,
                "image_size": m.image_size, "patch_size": m.patch_size,
                "num_channels": m.image_channels} | HF_FIXED | with_labels(names)


def tokenizer_labels(tokenizer: Any) -> dict[str, Any]:
  """config.json's id2label and label2id of a run's label tokenizer ({} for any other)."""
  if isinstance(tokenizer, tokenizers.SymbolTokenizer):
    return with_labels(list(tokenizer.units))
  return {}


def with_labels(names: list[str]) -> dict[str, Any]:
  """config.json's id2label and label2id of class names in label order."""
  return {"id2label": {str(i): n for i, n in enumerate(names)},
          "label2id": {n: i for i, n in enumerate(names)}}


def workdir_config(hf: dict[str, Any], state: dict[str, np.ndarray], hf_tokenizer: str = "",
                   text_file: str = "", data_dir: str = "") -> Config:
  """The full config of a converted ViT: no data (set data.dataset to train or evaluate it)."""
  del state, hf_tokenizer
  if text_file:
    raise ConvertError("--text_file: a ViT reads images; set data.dataset when training it")
  cd = get_config()
  cd.model.update(model_overrides(hf))
  cd.data.update(dataset="", data_dir=data_dir, batch_size=8)
  cd.train.update(optimizer="adamw", schedule="constant", warmup_steps=0, learning_rate=5e-5,
                  label_smoothing=0.0, grad_clip=1.0)
  cd.eval.update(metrics="", num_batches=0)
  cd.checkpoint.update(keep_best_by="")
  return from_configdict(cd)


def _classes_to_ours(x: np.ndarray, fill: float) -> np.ndarray:
  """A per-label table ([L] or [L, d]) in our ids: NUM_SPECIAL rows of `fill`, then the labels."""
  top = np.full((NUM_SPECIAL,) + x.shape[1:], fill, np.float32)
  return np.concatenate([top, x]).astype(np.float32)


def _weights(m: ModelConfig) -> list[Weight]:
  """Our EncoderOnly's parameters and ViT's tensors."""
  d, p, c = m.d_model, m.patch_size, m.image_channels
  e = "vit.embeddings"
  weights = [
      one("encoder.patch_embed.class_token", f"{e}.cls_token", reshaped(d), reshaped(1, 1, d)),
      one("encoder.position_embed.embedding", f"{e}.position_embeddings",
          lambda x: np.asarray(x)[0], lambda x: np.asarray(x)[None]),
      # Conv2d weight [d, C, p, p] -> our kernel over (row, column, channel) [p p C, d].
      *dense("encoder.patch_embed.projection", f"{e}.patch_embeddings.projection",
             lambda w: np.asarray(w).transpose(2, 3, 1, 0).reshape(p * p * c, d),
             lambda k: np.asarray(k).reshape(p, p, c, d).transpose(3, 2, 0, 1))]
  for i in range(m.num_encoder_layers):
    q = f"vit.encoder.layer.{i}"
    weights += encoder_layer(m, f"encoder.layers_{i}", q, "attention",
                             (f"{q}.layernorm_before", f"{q}.layernorm_after"))
  weights += [
      *norm("encoder.final_norm", "vit.layernorm"),
      one("head.classifier.kernel", "classifier.weight",
          lambda w: _classes_to_ours(np.asarray(w), 0.0).T,
          lambda k: np.asarray(k).T[NUM_SPECIAL:]),
      one("head.classifier.bias", "classifier.bias",
          lambda b: _classes_to_ours(np.asarray(b), EXCLUDED_LOGIT),
          lambda b: np.asarray(b)[NUM_SPECIAL:])]
  return weights


def params_from_hf(state: dict[str, np.ndarray], m: ModelConfig, hf: dict[str, Any],
                   tokenizer: Any = None) -> dict[str, Any]:
  """Our EncoderOnly parameters (unrolled layers, class-token head) from a
  ViTForImageClassification state dict."""
  del hf, tokenizer
  if "classifier.weight" not in state:
    raise ConvertError("the ViT weights have no classifier.* (a ViTForImageClassification "
                       "checkpoint; a ViTModel has no classification head)")
  labels = state["classifier.weight"].shape[0]
  if labels != m.num_classes - NUM_SPECIAL:
    raise ConvertError(f"classifier.weight has {labels} labels, config.json's id2label "
                       f"{m.num_classes - NUM_SPECIAL}")
  return params_of(state, _weights(m), FAMILY, m)


def hf_from_params(params: Any, m: ModelConfig, hf: dict[str, Any] | None = None
                   ) -> dict[str, np.ndarray]:
  """The ViTForImageClassification state dict (float32 numpy) of our parameters."""
  del hf
  return state_of(params, _weights(m))


def describe_workdir(cfg: Config) -> str:
  m = cfg.model
  return (f"ViT with {m.num_encoder_layers} layers, d_model {m.d_model}, {m.image_size}x"
          f"{m.image_size}x{m.image_channels} images in {m.patch_size}x{m.patch_size} patches, "
          f"{m.num_classes - NUM_SPECIAL} classes")


def describe_hf(hf: dict[str, Any]) -> str:
  return (f"ViT with {hf['num_hidden_layers']} layers, {hf['image_size']}px images, "
          f"{len(hf.get('id2label') or {})} labels")


FAMILY = Family(
    name=NAME, model_types=(MODEL_TYPE,), arch=ARCH, id_offset=ID_OFFSET, fixed=FIXED,
    hf_fixed=HF_FIXED, model_overrides=model_overrides, workdir_config=workdir_config,
    hf_config=hf_config, params_from_hf=params_from_hf, hf_from_params=hf_from_params,
    describe_workdir=describe_workdir, describe_hf=describe_hf,
    reads_images=True, label_tokenizer=label_tokenizer, hf_tokenizer_keys=tokenizer_labels,
    module=__name__)
