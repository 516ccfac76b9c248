"""Validates an ml_collections ConfigDict into frozen, typed, hashable dataclasses.

`from_configdict(cd)` checks every key before anything compiles: unknown and missing keys, wrong
types, unset placeholders, choices, sizes and the relations between them. Each problem is one
`ConfigError` line that names the key, e.g. `model.num_heads=6 must divide model.d_model=256`.
Field names are exactly the keys of transformer/defaults.py, which holds the defaults and their meaning.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Mapping

import ml_collections

from transformer import defaults, positional


class ConfigError(ValueError):
  """An invalid configuration; the message is one line naming the key."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  arch: str
  vocab_size: int
  source_vocab_size: int
  d_model: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  v_head_dim: int
  mlp_dim: int
  num_encoder_layers: int
  num_decoder_layers: int
  positional: str
  rope_base: float
  relative_num_buckets: int
  relative_max_distance: int
  norm: str
  norm_position: str
  norm_eps: float
  ffn: str
  use_bias: bool
  scale_attention_logits: bool
  scale_decoder_output: bool
  dropout_rate: float
  attention_dropout_rate: float
  ffn_dropout_rate: float
  dropout_bits: int
  tie_embeddings: bool
  share_src_tgt_embeddings: bool
  scale_embeddings: bool
  embedding_norm: bool
  head_transform: bool
  logits_bias: bool
  prefix_lm: bool
  head: str
  pooling: str
  num_classes: int
  attention_impl: str
  scan_layers: bool
  remat: str
  dtype: str
  param_dtype: str
  max_len: int


@dataclasses.dataclass(frozen=True)
class DataConfig:
  dataset: str
  data_dir: str
  train_split: str
  eval_split: str
  source_key: str
  target_key: str
  train_file: str
  dev_file: str
  test_file: str
  text_file: str
  text_split: str
  train_fraction: float
  label_fraction: float
  label: str
  objective: str
  mask_rate: float
  whole_word_masking: bool
  noise_density: float
  mean_span_length: float
  tokenizer: str
  source_tokenizer: str
  spm_model_type: str
  spm_vocab_size: int
  hf_tokenizer: str
  hf_id_offset: int
  max_source_len: int
  max_target_len: int
  too_long: str
  batching: str
  batch_size: int
  shuffle_seed: int
  prefetch: int


@dataclasses.dataclass(frozen=True)
class ScheduledSamplingConfig:
  schedule: str
  k: float
  c: float
  min_teacher_forcing: float


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  num_steps: int
  optimizer: str
  learning_rate: float
  schedule: str
  warmup_steps: int
  min_learning_rate_ratio: float
  b1: float
  b2: float
  eps: float
  momentum: float
  weight_decay: float
  weight_decay_norms_and_biases: bool
  weight_decay_embeddings: bool
  grad_clip: float
  grad_accum_steps: int
  steps_per_dispatch: int
  members: str
  label_smoothing: float
  z_loss: float
  ema_decay: float
  scheduled_sampling: ScheduledSamplingConfig
  early_stop_patience: int
  early_stop_metric: str
  early_stop_mode: str
  log_every_steps: int
  profile_start_step: int
  profile_num_steps: int


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  method: str
  beam_size: int
  length_penalty: float
  temperature: float
  top_k: int
  top_p: float
  max_decode_len: int


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  every_steps: int
  num_batches: int
  batch_size: int
  num_decode_examples: int
  metrics: str
  decode: DecodeConfig


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  every_steps: int
  keep: int
  keep_best_by: str
  best_mode: str
  async_save: bool


@dataclasses.dataclass(frozen=True)
class MeshShape:
  data: int
  fsdp: int
  tensor: int


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
  mode: str
  mesh_shape: MeshShape
  distributed: str
  coordinator_address: str
  num_processes: int
  process_id: int


@dataclasses.dataclass(frozen=True)
class Config:
  seed: int
  peak_flops: float
  model: ModelConfig
  data: DataConfig
  train: TrainConfig
  eval: EvalConfig
  checkpoint: CheckpointConfig
  parallel: ParallelConfig


# Keys whose value must be one of a fixed set.
CHOICES = {
    "model.arch": ("encoder_decoder", "decoder_only", "encoder_only"),
    "model.head": ("mlm", "classify", "tag"),
    "model.pooling": ("first", "mean"),
    "model.positional": tuple(positional.ENCODINGS),
    "model.norm": ("layernorm", "rmsnorm"),
    "model.norm_position": ("post", "pre"),
    "model.ffn": ("relu", "gelu", "gelu_tanh", "swiglu", "geglu", "geglu_tanh"),
    "model.attention_impl": ("einsum", "fused"),
    "model.dropout_bits": (8, 32),
    "model.remat": ("none", "full", "dots", "dots_no_batch"),
    "model.dtype": ("float32", "bfloat16", "float16"),
    "model.param_dtype": ("float32", "bfloat16", "float16"),
    "data.text_split": ("fraction", "document"),
    "data.objective": ("none", "mlm", "span"),
    "data.label": ("none", "primary_stress", "syllables"),
    "data.tokenizer": ("char", "byte", "symbol", "sentencepiece", "hf"),
    "data.source_tokenizer": ("", "char", "byte", "symbol", "sentencepiece", "hf"),
    "data.spm_model_type": ("bpe", "unigram"),
    "data.too_long": ("drop", "truncate"),
    "data.batching": ("pack", "bucket", "pad"),
    "train.optimizer": ("adam", "adamw", "adafactor", "sgd"),
    "train.schedule": ("rsqrt", "warmup_cosine", "warmup_linear", "constant"),
    "train.scheduled_sampling.schedule": ("none", "linear", "exponential", "inverse_sigmoid"),
    "train.early_stop_mode": ("min", "max"),
    "eval.decode.method": ("greedy", "sample", "beam"),
    "checkpoint.best_mode": ("min", "max"),
    "parallel.mode": ("mesh", "pmap"),
    "parallel.distributed": ("auto", "on", "off"),
}

# data.hf_id_offset: our id = a Hugging Face tokenizer's id + this (data/tokenizers.py HFTokenizer).
HF_ID_OFFSETS = (4, 0)

# Sizes that must be > 0 (those written 0 = "derive" are checked after resolution).
POSITIVE = (
    "model.d_model", "model.num_heads", "model.mlp_dim", "model.max_len",
    "model.relative_num_buckets", "model.relative_max_distance",
    "data.max_source_len", "data.max_target_len", "data.batch_size", "data.spm_vocab_size",
    "train.num_steps", "train.grad_accum_steps", "train.steps_per_dispatch",
    "train.log_every_steps",
    "eval.every_steps", "eval.decode.beam_size", "checkpoint.every_steps", "checkpoint.keep",
)
NON_NEGATIVE = (
    "model.vocab_size", "model.source_vocab_size", "model.num_kv_heads", "model.head_dim",
    "model.v_head_dim", "model.num_classes", "model.num_encoder_layers", "model.num_decoder_layers",
    "data.prefetch",
    "train.warmup_steps", "train.weight_decay", "train.grad_clip", "train.z_loss",
    "train.early_stop_patience", "eval.num_batches", "eval.batch_size",
    "eval.num_decode_examples", "eval.decode.top_k", "eval.decode.max_decode_len",
    "peak_flops",
)
UNIT_INTERVAL = (
    "model.dropout_rate", "model.attention_dropout_rate", "model.ffn_dropout_rate",
    "train.label_smoothing", "train.min_learning_rate_ratio", "data.train_fraction",
    "data.label_fraction", "data.mask_rate", "data.noise_density",
    "train.scheduled_sampling.min_teacher_forcing",
)


# Keys added after runs were saved. A saved config without one reads back with the value that
# reproduces what such a run did (fill_added_keys): the default (defaults.py), which every new key
# is given so that it means "as before", unless ADDED_KEYS says otherwise. Older workdirs thus still
# evaluate, restore and resume.
ADDED_KEYS: dict[str, Any] = {  # "section.key": the value before the key existed, if not the default
    "model.dropout_bits": 32,  # every dropout mask came from jax.random.bernoulli's 32-bit draws
}


def fill_added_keys(saved: dict[str, Any]) -> dict[str, Any]:
  """A copy of a saved config dict with each key it lacks from ADDED_KEYS, else the defaults;
  the keys it has are never changed."""
  default = defaults.get_config().to_dict()
  for key, value in ADDED_KEYS.items():
    section, name = key.split(".", 1)
    default[section][name] = value

  def fill(saved_part: dict[str, Any], default_part: dict[str, Any]) -> dict[str, Any]:
    out = dict(saved_part)
    for key, value in default_part.items():
      if key not in out:
        out[key] = value
      elif isinstance(value, dict) and isinstance(out[key], dict):
        out[key] = fill(out[key], value)
    return out

  return fill(saved, default)


def _convert(cls: type, value: Any, path: str) -> Any:
  """Builds dataclass `cls` from a mapping, checking keys and leaf types."""
  if not isinstance(value, (Mapping, ml_collections.ConfigDict)):
    raise ConfigError(f"{path or 'config'} must be a section (dict), got {value!r}")
  items = dict(value.items())
  hints = typing.get_type_hints(cls)
  names = [f.name for f in dataclasses.fields(cls)]
  for key in items:
    if key not in hints:
      raise ConfigError(f"unknown config key {path}{key} (known: {', '.join(names)})")
  kwargs = {}
  for name in names:
    key = f"{path}{name}"
    if name not in items:
      raise ConfigError(f"config key {key} is missing")
    kind, v = hints[name], items[name]
    if dataclasses.is_dataclass(kind):
      kwargs[name] = _convert(kind, v, key + ".")
      continue
    if v is None:
      raise ConfigError(f"config key {key} is unset (a placeholder with no value)")
    if kind is bool:
      ok = isinstance(v, bool)
    elif kind is int:
      ok = isinstance(v, int) and not isinstance(v, bool)
    elif kind is float:
      ok = isinstance(v, (int, float)) and not isinstance(v, bool)
      v = float(v) if ok else v
    else:
      ok = isinstance(v, str)
    if not ok:
      raise ConfigError(f"{key}={v!r} must be of type {kind.__name__}")
    kwargs[name] = v
  return cls(**kwargs)


def _get(cfg: Config, key: str) -> Any:
  value = cfg
  for part in key.split("."):
    value = getattr(value, part)
  return value


def _resolve_model(m: ModelConfig) -> ModelConfig:
  """Fills the sizes written 0 (derive) and checks the relations between model sizes."""
  if not m.head_dim and m.d_model % m.num_heads:
    raise ConfigError(f"model.num_heads={m.num_heads} must divide model.d_model={m.d_model} "
                      f"(or set model.head_dim)")
  kv_heads = m.num_kv_heads or m.num_heads
  if m.num_heads % kv_heads:
    raise ConfigError(
        f"model.num_kv_heads={m.num_kv_heads} must divide model.num_heads={m.num_heads}")
  head_dim = m.head_dim or m.d_model // m.num_heads
  resolved = dataclasses.replace(m, num_kv_heads=kv_heads, head_dim=head_dim,
                                 v_head_dim=m.v_head_dim or head_dim)
  check = positional.encoding(resolved).check
  problem = check(resolved) if check else None
  if problem:
    raise ConfigError(problem)
  if m.arch != "decoder_only" and not m.num_encoder_layers:
    raise ConfigError(f"model.num_encoder_layers=0 must be > 0 with model.arch={m.arch!r}")
  if m.arch != "encoder_only" and not m.num_decoder_layers:
    raise ConfigError("model.num_decoder_layers=0 must be > 0")
  return resolved


def _check_objective(cfg: Config) -> None:
  """The relations between data.objective and the architecture and head it trains."""
  d, m = cfg.data, cfg.model
  if d.label_fraction <= 0:
    raise ConfigError(f"data.label_fraction={d.label_fraction} must be in (0, 1]")
  if d.mean_span_length < 1:
    raise ConfigError(f"data.mean_span_length={d.mean_span_length} must be >= 1")
  if d.objective == "mlm" and not (m.arch == "encoder_only" and m.head == "mlm"):
    raise ConfigError(f"data.objective='mlm' needs model.arch='encoder_only' with "
                      f"model.head='mlm' (got {m.arch!r}, {m.head!r})")
  if d.objective == "span" and m.arch != "encoder_decoder":
    raise ConfigError(f"data.objective='span' needs model.arch='encoder_decoder', got {m.arch!r}")
  if m.arch == "encoder_only" and cfg.train.scheduled_sampling.schedule != "none":
    raise ConfigError("train.scheduled_sampling.schedule must be 'none' with "
                      "model.arch='encoder_only' (it has no decoder)")


def _validate(cfg: Config) -> Config:
  """Checks choices, ranges and cross-field relations; returns cfg with derived sizes filled."""
  for key, options in CHOICES.items():
    value = _get(cfg, key)
    if value not in options:
      raise ConfigError(f"{key}={value!r} is not one of "
                        f"{'|'.join(str(o) if o != '' else repr(o) for o in options)}")
  for key in POSITIVE:
    if _get(cfg, key) <= 0:
      raise ConfigError(f"{key}={_get(cfg, key)} must be > 0")
  for key in NON_NEGATIVE:
    if _get(cfg, key) < 0:
      raise ConfigError(f"{key}={_get(cfg, key)} must be >= 0")
  for key in UNIT_INTERVAL:
    if not 0.0 <= _get(cfg, key) <= 1.0:
      raise ConfigError(f"{key}={_get(cfg, key)} must be in [0, 1]")
  d = cfg.data
  if d.hf_id_offset not in HF_ID_OFFSETS:
    raise ConfigError(f"data.hf_id_offset={d.hf_id_offset} is not one of "
                      f"{'|'.join(map(str, HF_ID_OFFSETS))}")
  if d.max_source_len > cfg.model.max_len or d.max_target_len > cfg.model.max_len:
    longest = max(d.max_source_len, d.max_target_len)
    raise ConfigError(
        f"data.max_source_len/max_target_len={longest} must be <= model.max_len={cfg.model.max_len}")
  if cfg.train.label_smoothing >= 1.0:
    raise ConfigError(f"train.label_smoothing={cfg.train.label_smoothing} must be in [0, 1)")
  if not 0.0 <= cfg.train.ema_decay < 1.0:
    raise ConfigError(f"train.ema_decay={cfg.train.ema_decay} must be in [0, 1) (0 = off)")
  _check_objective(cfg)
  if cfg.train.learning_rate <= 0:
    raise ConfigError(f"train.learning_rate={cfg.train.learning_rate} must be > 0")
  if not 0.0 < cfg.eval.decode.top_p <= 1.0:
    raise ConfigError(f"eval.decode.top_p={cfg.eval.decode.top_p} must be in (0, 1]")
  if cfg.eval.decode.temperature <= 0:
    raise ConfigError(f"eval.decode.temperature={cfg.eval.decode.temperature} must be > 0")
  for axis, size in dataclasses.asdict(cfg.parallel.mesh_shape).items():
    if size == 0 or size < -1:
      raise ConfigError(f"parallel.mesh_shape.{axis}={size} must be > 0 or -1 (the rest)")
  if list(dataclasses.asdict(cfg.parallel.mesh_shape).values()).count(-1) > 1:
    raise ConfigError("parallel.mesh_shape: at most one axis may be -1")
  return dataclasses.replace(cfg, model=_resolve_model(cfg.model))


def from_configdict(cd: ml_collections.ConfigDict | Mapping[str, Any]) -> Config:
  """Validates a ConfigDict (or a plain nested dict) into a frozen Config; raises ConfigError."""
  return _validate(_convert(Config, cd, ""))


def to_dict(cfg: Any) -> dict[str, Any]:
  """The plain nested dict of a Config, a ConfigDict or a mapping ({} for None), for config.json."""
  if cfg is None:
    return {}
  if hasattr(cfg, "to_dict"):  # ml_collections.ConfigDict
    return cfg.to_dict()
  if dataclasses.is_dataclass(cfg):
    return dataclasses.asdict(cfg)
  return dict(cfg)


def model_config(**overrides: Any) -> ModelConfig:
  """A validated ModelConfig: transformer.defaults' model section plus `overrides` (tests, notebooks)."""
  cd = defaults.get_config()
  for key, value in overrides.items():
    if key not in cd.model:
      raise ConfigError(f"unknown config key model.{key}")
    cd.model[key] = value
  return from_configdict(cd).model
