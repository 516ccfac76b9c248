"""BERT (`BertForMaskedLM`) <-> our EncoderOnly with the masked-LM head.

BERT is our encoder_only with head=mlm, post-LN, learned positions, `embedding_norm`, biases,
hidden_act as `ffn` and an MLM head Norm(act(Dense(x))) (`head_transform`) before the vocabulary
projection plus a bias (`logits_bias`). Our pipeline has one segment type: import adds the type-0
row to every position row, export writes zero type rows. Ids: ours = BERT's + 4
(`data.hf_id_offset`); our pad, EOS, BOS and UNK take the rows of [PAD], [SEP], [CLS] and [UNK],
the objective's [MASK] and sentinels after the vocabulary (data/objectives.py) take [MASK]'s:
these ids are `model.excluded_ids`, and export drops their rows again.
"""

from typing import Any

import numpy as np

from transformer.config import Config, ModelConfig
from transformer.convert.common import (CONVERTED, converted_config, ConvertError, dense,
                                        encoder_layer, first_of, hf_choice, hf_ffn, norm, one,
                                        params_of, positive_ints, require, require_hf,
                                        require_unmapped_excluded, state_of, transpose,
                                        unmapped_ids, Weight)
from transformer.convert.family import Family
from transformer.data.objectives import ExtraIds
from transformer.data.tokenizers import BOS_ID, EOS_ID, NUM_SPECIAL, PAD_ID, UNK_ID

MODEL_TYPE, NAME, ARCH = "bert", "BERT", "encoder_only"
ID_OFFSET = NUM_SPECIAL
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "relu": "relu"}
# Our model config keys BERT fixes: set on import, required on export.
FIXED = dict(arch="encoder_only", head="mlm", positional="learned", norm="layernorm",
             norm_position="post", use_bias=True, scale_embeddings=False,
             scale_attention_logits=True, embedding_norm=True, head_transform=True,
             logits_bias=True, ffn_dropout_rate=0.0)
# config.json keys whose other values we lack: required on import, written on export.
HF_FIXED = dict(position_embedding_type="absolute", is_decoder=False, add_cross_attention=False)
OBJECTIVE_IDS = ExtraIds(0).total_vocab_size  # [MASK] and the sentinels (101)


def our_ids(hf_vocab: int) -> np.ndarray:
  """Our id of each of BERT's `hf_vocab` ids: id + NUM_SPECIAL."""
  return np.arange(hf_vocab) + NUM_SPECIAL


def model_overrides(hf: dict[str, Any], state: dict[str, np.ndarray] | None = None
                    ) -> dict[str, Any]:
  """Our model config keys for a BERT config.json dict; ConvertError names an unmappable key."""
  del state  # BERT's config says all
  require_hf(hf, HF_FIXED)
  positive_ints(hf, ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings"))
  ffn = hf_choice(hf, "hidden_act", "gelu", _ACTIVATIONS)
  d, heads = hf["hidden_size"], hf["num_attention_heads"]
  if d % heads:
    raise ConvertError(f"config.json: num_attention_heads={heads} does not divide "
                       f"hidden_size={d}")
  vocab = NUM_SPECIAL + hf["vocab_size"] + OBJECTIVE_IDS
  return CONVERTED | FIXED | dict(
      vocab_size=vocab, source_vocab_size=vocab,
      excluded_ids=unmapped_ids(our_ids(hf["vocab_size"]), vocab),
      d_model=d, num_heads=heads, head_dim=0, mlp_dim=hf["intermediate_size"],
      num_encoder_layers=hf["num_hidden_layers"], num_decoder_layers=0, ffn=ffn,
      norm_eps=float(hf.get("layer_norm_eps", 1e-12)), scale_decoder_output=False,
      dropout_rate=float(hf.get("hidden_dropout_prob", 0.1)),
      attention_dropout_rate=float(hf.get("attention_probs_dropout_prob", 0.1)),
      tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
      max_len=hf["max_position_embeddings"])


def hf_config(m: ModelConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
  """The BERT config.json dict of `m` (over `extra`'s); ConvertError names a key BERT lacks."""
  if m.d_model % m.num_heads:
    raise ConvertError(f"model.num_heads={m.num_heads} does not divide model.d_model="
                       f"{m.d_model}, as BERT's heads must")
  h = m.d_model // m.num_heads
  require(m, FIXED | {"num_kv_heads": m.num_heads, "head_dim": h, "v_head_dim": h}, NAME)
  activation = hf_ffn(m, (extra or {}).get("hidden_act"), _ACTIVATIONS, NAME)
  hf_vocab = _hf_vocab(m)
  require_unmapped_excluded(m, our_ids(hf_vocab), NAME)
  out = {"model_type": "bert", "architectures": ["BertForMaskedLM"], "pad_token_id": 0,
         "type_vocab_size": 2} | dict(extra or {})
  return out | {"vocab_size": hf_vocab, "hidden_size": m.d_model, "num_hidden_layers":
                m.num_encoder_layers, "num_attention_heads": m.num_heads, "intermediate_size":
                m.mlp_dim, "hidden_act": activation, "max_position_embeddings": m.max_len,
                "layer_norm_eps": m.norm_eps, "hidden_dropout_prob": m.dropout_rate,
                "attention_probs_dropout_prob": m.attention_dropout_rate,
                "tie_word_embeddings": m.tie_embeddings} | HF_FIXED


def _hf_vocab(m: ModelConfig) -> int:
  """BERT's vocabulary inside ours: our vocab minus our 4 reserved ids and the objective's 101."""
  hf_vocab = m.vocab_size - NUM_SPECIAL - OBJECTIVE_IDS
  if hf_vocab <= 0:
    raise ConvertError(f"model.vocab_size={m.vocab_size} leaves no BERT ids (ids below "
                       f"{NUM_SPECIAL} and the masked-LM objective's last "
                       f"{OBJECTIVE_IDS} are ours)")
  return hf_vocab


def workdir_config(hf: dict[str, Any], state: dict[str, np.ndarray], hf_tokenizer: str,
                   text_file: str = "", data_dir: str = "") -> Config:
  """The full config of a converted BERT, masked-LM data from `text_file` if given."""
  m = model_overrides(hf, state)
  return converted_config(
      m, hf_tokenizer, ID_OFFSET, min(128, m["max_len"]),
      data=dict(dataset="text_files" if text_file else "", text_file=text_file,
                data_dir=data_dir, objective="mlm", mask_rate=0.15, batching="pack"),
      train=dict(optimizer="adamw", learning_rate=5e-5, eps=1e-6),
      evaluation=dict(metrics="", num_batches=20))


def _special_ids(tokenizer: Any) -> dict[int, int]:
  """Our reserved ids (and -1 for [MASK]) -> the BERT ids whose rows they take."""
  out = {}
  specials = {PAD_ID: "[PAD]", EOS_ID: "[SEP]", BOS_ID: "[CLS]", UNK_ID: "[UNK]", -1: "[MASK]"}
  for ours, token in specials.items():
    hf_id = tokenizer.token_id(token) if tokenizer is not None else None
    if hf_id is None:
      raise ConvertError(f"tokenizer.json has no {token} token (a BERT WordPiece tokenizer?)")
    out[ours] = hf_id
  return out


def _with_our_rows(table: np.ndarray, ids: dict[int, int]) -> np.ndarray:
  """A BERT table ([V, d] or [V]) in our ids: 4 reserved rows, BERT's V, [MASK]'s for the rest."""
  top = np.stack([table[ids[i]] for i in range(NUM_SPECIAL)])
  tail = np.repeat(table[ids[-1]][None], OBJECTIVE_IDS, axis=0)
  return np.concatenate([top, table, tail]).astype(table.dtype)


def _weights(m: ModelConfig, hf: dict[str, Any] | None, ids: dict[int, int] | None = None
             ) -> list[Weight]:
  """Our EncoderOnly's parameters and BERT's tensors; `ids` (`_special_ids`) is for import."""
  d = m.d_model
  to_ours = lambda x: _with_our_rows(x, ids)  # noqa: E731
  to_hf = lambda x: np.asarray(x)[NUM_SPECIAL:NUM_SPECIAL + _hf_vocab(m)]  # noqa: E731
  e, t = "bert.embeddings", "cls.predictions"
  positions, types = f"{e}.position_embeddings.weight", f"{e}.token_type_embeddings.weight"
  num_types = int((hf or {}).get("type_vocab_size", 2))
  weights = [
      one("token_embed.embedding", f"{e}.word_embeddings.weight", to_ours, to_hf),
      # One segment type: its row joins every position's.
      Weight("encoder.position_embed.embedding", lambda s: s[positions] + s[types][0][None],
             lambda x: {positions: x, types: np.zeros((num_types, d), np.asarray(x).dtype)}),
      *norm("encoder.embedding_norm", f"{e}.LayerNorm")]
  for i in range(m.num_encoder_layers):
    q = f"bert.encoder.layer.{i}"
    weights += encoder_layer(m, f"encoder.layers_{i}", q, "self",
                             (f"{q}.attention.output.LayerNorm", f"{q}.output.LayerNorm"))
  weights += [
      *dense("head.transform", f"{t}.transform.dense", transpose, transpose),
      *norm("head.transform_norm", f"{t}.transform.LayerNorm"),
      # BERT's forward adds the decoder's bias (an untied head's cls.predictions.bias is never
      # read; a tied one's is the same tensor).
      Weight("head.logits_bias.bias",
             lambda s: to_ours(first_of(s, (f"{t}.decoder.bias", f"{t}.bias"), NAME)),
             lambda x: dict.fromkeys((f"{t}.bias", f"{t}.decoder.bias"), to_hf(x)))]
  if not m.tie_embeddings:
    weights.append(one("head.logits_dense.kernel", f"{t}.decoder.weight",
                       lambda x: to_ours(x).T, lambda x: to_hf(np.asarray(x).T)))
  return weights


def params_from_hf(state: dict[str, np.ndarray], m: ModelConfig, hf: dict[str, Any],
                   tokenizer: Any = None) -> dict[str, Any]:
  """Our EncoderOnly parameters (unrolled layers, MLM head) from a BertForMaskedLM state dict."""
  ids = _special_ids(tokenizer)
  if tokenizer.vocab_size != NUM_SPECIAL + hf["vocab_size"]:
    raise ConvertError(f"tokenizer.json has {tokenizer.vocab_size - NUM_SPECIAL} ids and "
                       f"config.json vocab_size={hf['vocab_size']}: the masked-LM objective's "
                       f"[MASK] comes after the tokenizer's ids, so they must be equal")
  if "cls.predictions.transform.dense.weight" not in state:
    raise ConvertError("the BERT weights have no cls.predictions.* (a BertForMaskedLM "
                       "checkpoint; a BertModel has no masked-LM head)")
  return params_of(state, _weights(m, hf, ids), FAMILY, m)


def hf_from_params(params: Any, m: ModelConfig, hf: dict[str, Any] | None = None
                   ) -> dict[str, np.ndarray]:
  """The BertForMaskedLM state dict (float32 numpy) of our parameters, `hf` its config.json."""
  return state_of(params, _weights(m, hf))


def describe_workdir(cfg: Config) -> str:
  m = cfg.model
  return (f"BERT with {m.num_encoder_layers} layers, d_model {m.d_model}, vocabulary "
          f"{m.vocab_size} ({NUM_SPECIAL} ours + {_hf_vocab(m)} + the masked-LM objective's "
          f"{OBJECTIVE_IDS})")


def describe_hf(hf: dict[str, Any]) -> str:
  return f"BERT with {hf['num_hidden_layers']} layers, vocabulary {hf['vocab_size']}"


FAMILY = Family(
    name=NAME, model_types=(MODEL_TYPE,), arch=ARCH, id_offset=ID_OFFSET, fixed=FIXED,
    hf_fixed=HF_FIXED, model_overrides=model_overrides, workdir_config=workdir_config,
    hf_config=hf_config, params_from_hf=params_from_hf, hf_from_params=hf_from_params,
    describe_workdir=describe_workdir, describe_hf=describe_hf,
    # The id buffers older files hold; the tied head's copy of the word embeddings;
    # BertForPreTraining's pooler and next-sentence head, which the masked LM does not use.
    unused=(r"bert\.embeddings\.(position|token_type)_ids", r"cls\.predictions\.decoder\.weight",
            r"bert\.pooler\..*", r"cls\.seq_relationship\..*"),
    module=__name__)
