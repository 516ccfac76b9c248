"""`from_configdict`: an ml_collections ConfigDict validated, before anything compiles, into the
frozen (hashable: jit static arguments) config classes declared in transformer/schema.py, which
this module re-exports (`transformer.config.ModelConfig` is `transformer.schema.ModelConfig`).
Each problem is one `ConfigError` line naming the key, e.g. `model.num_heads=6 must divide
model.d_model=256`."""

import dataclasses
import math
from typing import Any, Mapping

import ml_collections

from transformer import choices, keyspec
# ConfigError (keyspec.py) and the config classes (schema.py) are imported from here by the library.
from transformer.keyspec import ConfigError, RANGES
from transformer.schema import (  # noqa: F401
    CheckpointConfig, Config, DataConfig, DecodeConfig, EvalConfig, get_config, KEYS, MeshShape,
    ModelConfig, ParallelConfig, ScheduledSamplingConfig, TrainConfig)

# A saved config.json carries FORMAT; a run saved in another format is refused in one line.
FORMAT = 1


def check_value(name: str, v: Any) -> Any:
  """`v` checked against key `name`'s type, allowed values and range (ints widen to floats)."""
  key = KEYS[name]
  if v is None:
    raise ConfigError(f"config key {key.name} is unset (a placeholder with no value)")
  kind = type(key.default)
  if (not isinstance(v, (int, float) if kind is float else kind)
      or isinstance(v, bool) and kind is not bool):
    raise ConfigError(f"{key.name}={v!r} must be of type {kind.__name__}")
  if kind is float:
    v = float(v)
    if not math.isfinite(v):
      raise ConfigError(f"{key.name}={v} must be a finite number")
  if (options := key.choices()) and v not in options:
    raise keyspec.not_one_of(key.name, v, options)
  if key.range and not RANGES[key.range](v):
    raise ConfigError(f"{key.name}={v!r} must be {key.range}")
  return v


def integral_override(arg: str) -> str:
  """A `--config.KEY=VALUE` argument of an int key with an integral VALUE written as an int
  ('1e3', '1000.0' -> '1000'); other arguments as they are. ConfigError if VALUE is no integer."""
  name, sep, value = arg.removeprefix("--config.").partition("=")
  key = KEYS.get(name)
  if not (arg.startswith("--config.") and sep and key is not None and type(key.default) is int):
    return arg
  try:
    return f"--config.{name}={int(value)}"
  except ValueError:
    pass
  try:
    number = float(value)
  except ValueError:
    number = math.nan
  if not number.is_integer():
    raise ConfigError(f"--config.{name}={value}: must be an integer")
  return f"--config.{name}={int(number)}"


def _convert(cls: type, section: str, value: Any) -> Any:
  """Builds config class `cls` (of `section`, "" for Config) from a mapping, checking keys and
  leaves."""
  path = section + "." if section else ""
  if not isinstance(value, (Mapping, ml_collections.ConfigDict)):
    raise ConfigError(f"{section or 'config'} must be a section (dict), got {value!r}")
  items = dict(value.items())
  if not section and (fmt := items.pop("format", FORMAT)) != FORMAT:
    raise ConfigError(f"config format {fmt!r} is not this code's format {FORMAT}")
  fields = {f.name: f.type for f in dataclasses.fields(cls)}
  for name in items:
    if name not in fields:
      raise ConfigError(f"unknown config key {path}{name} (known: {', '.join(fields)})")
  kwargs = {}
  for name, kind in fields.items():
    if name not in items:
      raise ConfigError(f"config key {path}{name} is missing")
    kwargs[name] = (_convert(kind, path + name, items[name]) if dataclasses.is_dataclass(kind)
                    else check_value(path + name, items[name]))
  return cls(**kwargs)


def _check_positional(m: ModelConfig) -> None:
  """The sizes an encoding needs: rope's even head_dim, relative's buckets, sincos2d's d_model."""
  if m.positional == "rope" and m.head_dim % 2:
    raise ConfigError(f"model.head_dim={m.head_dim} must be even with model.positional='rope'")
  if m.positional == "relative":
    # The log-spaced buckets must reach beyond the exact ones (else NaN); bidirectional halves them.
    least = 4 if m.arch == "encoder_decoder" else 2
    if m.relative_num_buckets < least:
      raise ConfigError(f"model.relative_num_buckets={m.relative_num_buckets} must be >= {least} "
                        f"with model.arch={m.arch!r}")
    if m.relative_max_distance <= m.relative_num_buckets // 2:  # the causal exact buckets
      raise ConfigError(f"model.relative_max_distance={m.relative_max_distance} must be > "
                        f"model.relative_num_buckets // 2 = {m.relative_num_buckets // 2}")
  if m.positional == "sincos2d" and (m.d_model % 4 or m.d_model < 8):
    raise ConfigError(f"model.d_model={m.d_model} must be a multiple of 4 and >= 8 with "
                      f"'sincos2d'")


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
  _check_positional(resolved)
  if m.rope_scaling != "none" and m.positional != "rope":
    raise ConfigError(f"model.rope_scaling={m.rope_scaling!r} needs model.positional='rope', got "
                      f"{m.positional!r}")
  if m.rope_scaling == "llama3" and m.rope_high_freq_factor <= m.rope_low_freq_factor:
    raise ConfigError(f"model.rope_high_freq_factor={m.rope_high_freq_factor} must be > "
                      f"model.rope_low_freq_factor={m.rope_low_freq_factor} with "
                      f"model.rope_scaling='llama3'")
  if choices.FFNS[m.ffn].mixture and m.moe_top_k > m.moe_num_experts:
    raise ConfigError(f"model.moe_top_k={m.moe_top_k} must be <= model.moe_num_experts="
                      f"{m.moe_num_experts}")
  _check_images(m)
  if m.parametrization == "mup" and m.mup_base_width <= 0:
    raise ConfigError("model.parametrization='mup' needs model.mup_base_width > 0 (the d_model at "
                      "which µP equals the standard parametrization)")
  if m.arch != "decoder_only" and not m.num_encoder_layers:
    raise ConfigError(f"model.num_encoder_layers=0 must be > 0 with model.arch={m.arch!r}")
  if m.arch != "encoder_only" and not m.num_decoder_layers:
    raise ConfigError("model.num_decoder_layers=0 must be > 0")
  return resolved


def _check_images(m: ModelConfig) -> None:
  """The relations of an image model's keys (model.image_size > 0: a ViT)."""
  if not m.image_size:
    if m.pooling == "class_token":
      raise ConfigError("model.pooling='class_token' needs image inputs (model.image_size > 0)")
    return
  if m.arch != "encoder_only" or m.head != "classify":
    raise ConfigError(f"model.image_size={m.image_size} needs model.arch='encoder_only' with "
                      f"model.head='classify' (got {m.arch!r}, {m.head!r})")
  if m.image_size % m.patch_size:
    raise ConfigError(f"model.patch_size={m.patch_size} must divide "
                      f"model.image_size={m.image_size}")
  length = (m.image_size // m.patch_size) ** 2 + (m.pooling == "class_token")
  if m.positional == "learned" and length > m.max_len:
    raise ConfigError(f"model.max_len={m.max_len} must be >= {length}, the patches"
                      f"{' and the class token' if m.pooling == 'class_token' else ''}")


def excluded_ids(m: ModelConfig) -> tuple[int, ...]:
  """The sorted ids of model.excluded_ids ("0,2-3,54"); a ConfigError names the key if it is bad."""
  ids: set[int] = set()
  for part in filter(None, (p.strip() for p in m.excluded_ids.split(","))):
    low, dash, high = part.partition("-")
    if not (low.isdigit() and (high.isdigit() or not dash)) or int(high or low) < int(low):
      raise ConfigError(f"model.excluded_ids={m.excluded_ids!r}: {part!r} is not an id or a "
                        f"range a-b with a <= b (e.g. '0,2-3,54')")
    ids.update(range(int(low), int(high or low) + 1))
  return tuple(sorted(ids))


def id_ranges(ids: Any) -> str:
  """The model.excluded_ids string of a collection of ids: sorted, runs written a-b."""
  out, ids = [], sorted({int(i) for i in ids})
  for i in ids:
    if out and out[-1][1] == i - 1:
      out[-1][1] = i
    else:
      out.append([i, i])
  return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def _validate(cfg: Config) -> Config:
  """Checks the relations between keys; returns cfg with derived sizes filled."""
  d, m, dec = cfg.data, cfg.model, cfg.eval.decode
  if dec.max_decode_len > m.max_len:
    raise ConfigError(f"eval.decode.max_decode_len={dec.max_decode_len} must be <= "
                      f"model.max_len={m.max_len} (the decoding cache's length)")
  excluded = excluded_ids(m)
  if excluded and m.vocab_size and excluded[-1] >= m.vocab_size:
    raise ConfigError(f"model.excluded_ids={m.excluded_ids!r} names id {excluded[-1]}, outside "
                      f"model.vocab_size={m.vocab_size}")
  if m.vocab_size and m.start_embedding_id >= m.vocab_size:
    raise ConfigError(f"model.start_embedding_id={m.start_embedding_id} is outside "
                      f"model.vocab_size={m.vocab_size}")
  too_long = [f"data.{k}={getattr(d, k)}" for k in ("max_source_len", "max_target_len")
              if getattr(d, k) > m.max_len]
  if too_long and not m.image_size:  # an image model reads no token rows
    raise ConfigError(f"{' and '.join(too_long)} must be <= model.max_len={m.max_len}")
  if d.objective == "mlm" and not (m.arch == "encoder_only" and m.head == "mlm"):
    raise ConfigError(f"data.objective='mlm' needs model.arch='encoder_only' with "
                      f"model.head='mlm' (got {m.arch!r}, {m.head!r})")
  if d.objective == "span" and m.arch != "encoder_decoder":
    raise ConfigError(f"data.objective='span' needs model.arch='encoder_decoder', got {m.arch!r}")
  if m.arch == "encoder_only" and cfg.train.scheduled_sampling.schedule != "none":
    raise ConfigError("train.scheduled_sampling.schedule must be 'none' with "
                      "model.arch='encoder_only' (it has no decoder)")
  ss = cfg.train.scheduled_sampling
  if ss.schedule == "exponential" and not 0.0 <= ss.k <= 1.0:
    raise ConfigError(f"train.scheduled_sampling.k={ss.k!r} must be in [0, 1] with "
                      "schedule='exponential' (the base of k**step)")
  if ss.schedule == "inverse_sigmoid" and not ss.k > 0:
    raise ConfigError(f"train.scheduled_sampling.k={ss.k!r} must be > 0 with "
                      "schedule='inverse_sigmoid' (k / (k + exp(step / k)))")
  if list(dataclasses.asdict(cfg.parallel.mesh_shape).values()).count(-1) > 1:
    raise ConfigError("parallel.mesh_shape: at most one axis may be -1")
  return dataclasses.replace(cfg, model=_resolve_model(m))


def from_configdict(cd: ml_collections.ConfigDict | Mapping[str, Any]) -> Config:
  """Validates a ConfigDict (or a plain nested dict) into a frozen Config; raises ConfigError."""
  return _validate(_convert(Config, "", cd))


def format_problem(saved: Mapping[str, Any], source: str) -> str | None:
  """One line if the saved config dict (from `source`) is not in this code's FORMAT, else None."""
  if saved.get("format") == FORMAT:
    return None
  return (f"{source}: a run saved in config format {saved.get('format', 0)}; this code reads "
          f"format {FORMAT} (train it again to use it here)")


def to_dict(cfg: Any) -> dict[str, Any]:
  """The plain nested dict (config.json) of a Config (with FORMAT), ConfigDict, mapping or None."""
  if hasattr(cfg, "to_dict"):  # ml_collections.ConfigDict
    return cfg.to_dict()
  if dataclasses.is_dataclass(cfg):
    return {"format": FORMAT, **dataclasses.asdict(cfg)}
  return dict(cfg or {})


def model_config(**overrides: Any) -> ModelConfig:
  """A validated ModelConfig: the defaults' model section plus `overrides` (tests, notebooks)."""
  cd = get_config()
  for key, value in overrides.items():
    cd.model[key] = value  # an unknown key is refused by from_configdict
  return from_configdict(cd).model
