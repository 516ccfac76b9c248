"""Tests for transformer.config: valid configs resolve, every invalid config is one ConfigError line."""

import copy

import hypothesis
from hypothesis import strategies as st
import ml_collections
import pytest

from configs import base
from transformer import config as config_lib, keyspec, schema
from transformer.model import positional


def _base_dict():
  return base.get_config().to_dict()


def _set(d, key, value):
  parts = key.split(".")
  for part in parts[:-1]:
    d = d[part]
  d[parts[-1]] = value


def test_base_config_validates_and_resolves_derived_sizes():
  """The defaults are valid and 0-sizes resolve: kv heads = heads, head_dim = d_model / heads."""
  cfg = config_lib.from_configdict(base.get_config())
  assert cfg.model.num_kv_heads == 8 and cfg.model.head_dim == 64 and cfg.model.v_head_dim == 64
  assert cfg.model.norm_position == "post" and cfg.model.positional == "sinusoidal"
  assert cfg.train.label_smoothing == 0.1 and cfg.model.tie_embeddings
  hash(cfg)  # usable as a jit static argument


def test_to_dict_round_trips():
  """to_dict gives a plain dict that validates back to an equal Config."""
  cfg = config_lib.from_configdict(base.get_config())
  assert config_lib.from_configdict(config_lib.to_dict(cfg)) == cfg


@pytest.mark.parametrize("key,value,message", [
    ("model.num_heads", 6,
     "model.num_heads=6 must divide model.d_model=512 (or set model.head_dim)"),
    ("data.hf_id_offset", 2, "data.hf_id_offset=2 is not one of 4|0"),
    ("model.ffn", "gated-gelu", "model.ffn='gated-gelu' is not one of"),
    ("model.positional", "rotary",
     f"model.positional='rotary' is not one of {'|'.join(positional.ENCODINGS)}"),
    ("model.num_kv_heads", 3, "model.num_kv_heads=3 must divide model.num_heads=8"),
    ("model.d_model", -4, "model.d_model=-4 must be > 0"),
    ("model.d_model", "big", "model.d_model='big' must be of type int"),
    ("model.use_bias", 1, "model.use_bias=1 must be of type bool"),
    ("model.dropout_rate", 1.5, "model.dropout_rate=1.5 must be in [0, 1]"),
    ("data.batch_size", 0, "data.batch_size=0 must be > 0"),
    ("train.learning_rate", None, "config key train.learning_rate is unset"),
    ("eval.decode.method", "sampling", "eval.decode.method='sampling' is not one of"),
    ("parallel.mesh_shape.fsdp", 0, "parallel.mesh_shape.fsdp=0 must be > 0 or -1"),
    ("model.excluded_ids", "0,3-1", "model.excluded_ids='0,3-1': '3-1' is not an id or a range"),
    ("model.excluded_ids", "x", "model.excluded_ids='x': 'x' is not an id or a range"),
])
def test_each_invalid_value_names_the_key(key, value, message):
  """Each invalid value is rejected with a one-line message naming the key and the reason."""
  d = _base_dict()
  _set(d, key, value)
  with pytest.raises(config_lib.ConfigError) as info:
    config_lib.from_configdict(d)
  assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("changes,message", [
    ({"train.b1": 1.0}, "train.b1=1.0 must be in [0, 1)"),
    ({"train.b2": -0.1}, "train.b2=-0.1 must be in [0, 1)"),
    ({"train.eps": 0.0}, "train.eps=0.0 must be > 0"),
    ({"train.momentum": 1.5}, "train.momentum=1.5 must be in [0, 1)"),
    ({"train.learning_rate": 0.0}, "train.learning_rate=0.0 must be > 0"),
    ({"train.min_learning_rate_ratio": 1.5}, "train.min_learning_rate_ratio=1.5 must be in [0, 1]"),
    ({"train.weight_decay": -1e-4}, "train.weight_decay=-0.0001 must be >= 0"),
    ({"train.ema_decay": 1.0}, "train.ema_decay=1.0 must be in [0, 1)"),
    ({"train.label_smoothing": 1.0}, "train.label_smoothing=1.0 must be in [0, 1)"),
    ({"train.scheduled_sampling.c": -0.5}, "train.scheduled_sampling.c=-0.5 must be >= 0"),
    ({"train.scheduled_sampling.schedule": "exponential", "train.scheduled_sampling.k": 2.0},
     "train.scheduled_sampling.k=2.0 must be in [0, 1] with schedule='exponential'"),
    ({"train.scheduled_sampling.schedule": "inverse_sigmoid", "train.scheduled_sampling.k": 0.0},
     "train.scheduled_sampling.k=0.0 must be > 0 with schedule='inverse_sigmoid'"),
])
def test_optimizer_and_schedule_keys_outside_their_range_are_refused(changes, message):
  """A value outside the optimizer's or schedule's mathematical range (a beta of 1, a zero
  epsilon, a base above 1) is refused in one line naming the key, not trained to garbage."""
  d = _base_dict()
  for key, value in changes.items():
    _set(d, key, value)
  with pytest.raises(config_lib.ConfigError) as info:
    config_lib.from_configdict(d)
  assert message in str(info.value) and "\n" not in str(info.value)


def test_every_optimizer_and_schedule_key_has_a_range():
  """Each numeric key of the optimizer, its schedule and the loss declares a range (k is checked
  against its schedule in config.py, its meaning depending on the schedule)."""
  unranged = {"train.scheduled_sampling.k", "train.profile_start_step", "train.profile_num_steps"}
  numeric = [k for k in schema.SCHEMA if k.name.startswith("train.")
             and type(k.default) in (int, float) and k.name not in unranged]
  assert len(numeric) > 15 and all(k.range for k in numeric), [k.name for k in numeric
                                                              if not k.range]


def test_head_dim_is_independent_of_d_model_over_num_heads():
  """An explicit model.head_dim frees num_heads from dividing d_model (T5's d_kv, e.g. d_model
  512 with 6 heads of 64): it validates as given, v_head_dim follows it, and a model of it builds
  query/key/value kernels of that head size."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top  (this one test builds a model)
  import jax  # pylint: disable=g-import-not-at-top
  from transformer.model.models import build_model  # pylint: disable=g-import-not-at-top
  cfg = config_lib.model_config(d_model=32, num_heads=3, head_dim=16, mlp_dim=48, vocab_size=20,
                                source_vocab_size=20, num_encoder_layers=1, num_decoder_layers=1)
  assert (cfg.head_dim, cfg.v_head_dim) == (16, 16)
  params = jax.eval_shape(lambda: build_model(cfg).init(
      jax.random.key(0), jax.numpy.ones((1, 4), int), jax.numpy.ones((1, 3), int)))["params"]
  params = nn.meta.unbox(params)
  layer = params["encoder"]["layers_0"]["self_attention"]
  assert layer["qkv"]["kernel"].shape == (32, 3, 3, 16)
  assert layer["out"]["kernel"].shape == (3, 16, 32)


def test_odd_head_dim_with_rope():
  """RoPE rotates pairs of dimensions, so an odd head_dim is rejected."""
  d = _base_dict()
  _set(d, "model.positional", "rope")
  _set(d, "model.head_dim", 7)
  with pytest.raises(config_lib.ConfigError, match=r"model.head_dim=7 must be even"):
    config_lib.from_configdict(d)


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only"])
def test_relative_max_distance_must_exceed_the_exact_buckets(arch):
  """With relative positions, relative_max_distance at or below relative_num_buckets // 2 (the
  decoder's exact-bucket offsets) gave NaN biases or backwards buckets: one line naming the key
  and the bound; one more validates; unused (another positional) it is not checked. The encoder's
  bidirectional buckets need relative_num_buckets >= 4."""
  d = _base_dict()
  _set(d, "model.arch", arch)
  _set(d, "model.positional", "relative")
  _set(d, "model.relative_max_distance", 16)
  with pytest.raises(config_lib.ConfigError) as info:
    config_lib.from_configdict(d)
  assert str(info.value) == ("model.relative_max_distance=16 must be > "
                             "model.relative_num_buckets // 2 = 16")
  _set(d, "model.relative_max_distance", 17)
  assert config_lib.from_configdict(d).model.relative_max_distance == 17
  _set(d, "model.relative_num_buckets", 3)
  _set(d, "model.relative_max_distance", 2)
  if arch == "encoder_decoder":
    with pytest.raises(config_lib.ConfigError, match="model.relative_num_buckets=3 must be >= 4"):
      config_lib.from_configdict(d)
  else:
    config_lib.from_configdict(d)
  _set(d, "model.positional", "sinusoidal")
  _set(d, "model.relative_max_distance", 1)
  config_lib.from_configdict(d)


def test_unknown_and_missing_keys():
  """A misspelt key is reported as unknown; a removed key as missing."""
  d = _base_dict()
  d["model"]["num_layer"] = 4
  with pytest.raises(config_lib.ConfigError, match=r"unknown config key model.num_layer"):
    config_lib.from_configdict(d)
  d = _base_dict()
  del d["train"]["warmup_steps"]
  with pytest.raises(config_lib.ConfigError, match=r"config key train.warmup_steps is missing"):
    config_lib.from_configdict(d)


def test_unset_placeholder_is_rejected():
  """ml_collections placeholders come back as None when unset; the validator names them."""
  cd = base.get_config()
  cd.train.learning_rate = ml_collections.config_dict.placeholder(float)
  with pytest.raises(config_lib.ConfigError, match=r"train.learning_rate is unset"):
    config_lib.from_configdict(cd)


def test_model_config_overrides():
  """model_config applies overrides on the defaults and validates them."""
  m = config_lib.model_config(d_model=32, num_heads=4, num_kv_heads=2)
  assert (m.head_dim, m.num_kv_heads) == (8, 2)
  with pytest.raises(config_lib.ConfigError, match="unknown config key model.heads"):
    config_lib.model_config(heads=2)


def _leaf_keys(d, prefix=""):
  for k, v in d.items():
    if isinstance(v, dict):
      yield from _leaf_keys(v, prefix + k + ".")
    else:
      yield prefix + k


LEAVES = sorted(_leaf_keys(_base_dict()))
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 1024),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                   st.sampled_from(sorted({v for k in schema.SCHEMA for v in k.choices()},
                                          key=repr)),
                   st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.lists(st.tuples(st.sampled_from(LEAVES), VALUES), min_size=1, max_size=4))
def test_random_configs_validate_or_raise_config_error(changes):
  """Property: any mutation of the defaults either validates or raises ConfigError, nothing else."""
  d = copy.deepcopy(_base_dict())
  for key, value in changes:
    _set(d, key, value)
  try:
    cfg = config_lib.from_configdict(d)
  except config_lib.ConfigError as e:
    assert "\n" not in str(e)
  else:
    assert cfg.model.d_model % cfg.model.num_heads == 0


def test_excluded_ids_parse_and_relate_to_the_vocabulary():
  """model.excluded_ids reads ids and inclusive ranges (id_ranges writes the same string back);
  an id outside model.vocab_size is a one-line error naming the key."""
  m = config_lib.model_config(vocab_size=60, excluded_ids=" 0, 2-3 ,54")
  assert config_lib.excluded_ids(m) == (0, 2, 3, 54)
  assert config_lib.id_ranges([54, 3, 0, 2, 55, 56]) == "0,2-3,54-56"
  assert config_lib.id_ranges([]) == "" and config_lib.excluded_ids(config_lib.model_config()) == ()
  with pytest.raises(config_lib.ConfigError, match=r"^model.excluded_ids='0,60' names id 60, "
                     r"outside model.vocab_size=60$"):
    config_lib.model_config(vocab_size=60, excluded_ids="0,60")


def test_docs_config_md_is_the_generated_key_reference():
  """docs/config.md is exactly what `python -m transformer.schema` prints (regenerate it so)."""
  import pathlib  # pylint: disable=g-import-not-at-top
  path = pathlib.Path(__file__).resolve().parent.parent / "docs" / "config.md"
  assert path.read_text() == schema.markdown(), "python -m transformer.schema > docs/config.md"


def test_every_key_is_declared_once_with_a_meaning_and_valid_range_and_roles():
  """SCHEMA: unique names, a meaning each, a known range, known roles, a default that validates."""
  names = [k.name for k in schema.SCHEMA]
  assert len(names) == len(set(names))
  for k in schema.SCHEMA:
    assert k.meaning and (not k.range or k.range in keyspec.RANGES), k.name
    assert k.roles <= set(keyspec.ROLES), k.name
    assert not k.choices() or k.default in k.choices(), k.name
    assert not k.range or keyspec.RANGES[k.range](k.default), k.name


def test_the_config_classes_are_the_declaration():
  """Each key is a field of its section's class in transformer/schema.py (what an editor's go to
  definition on cfg.model.d_model opens), carrying its meaning; transformer.config re-exports the
  classes, and a Config pickles and hashes."""
  import inspect  # pylint: disable=g-import-not-at-top
  import pickle  # pylint: disable=g-import-not-at-top
  source = inspect.getsource(schema.ModelConfig)
  assert 'd_model: int = key(512, "width of the residual stream"' in source
  assert config_lib.ModelConfig is schema.ModelConfig and config_lib.Config is schema.Config
  cfg = config_lib.from_configdict(base.get_config())
  assert pickle.loads(pickle.dumps(cfg)) == cfg
  assert hash(cfg) == hash(config_lib.from_configdict(base.get_config()))
  assert config_lib.to_dict(schema.Config()) == {"format": 1, **base.get_config().to_dict()}


@pytest.mark.parametrize("arg, want", [
    ("--config.train.num_steps=1e3", "--config.train.num_steps=1000"),
    ("--config.train.num_steps=1000.0", "--config.train.num_steps=1000"),
    ("--config.train.num_steps=7", "--config.train.num_steps=7"),
    ("--config.train.learning_rate=1e-3", "--config.train.learning_rate=1e-3"),  # a float key
    ("--workdir=1e3", "--workdir=1e3"),
])
def test_an_integral_value_of_an_int_key_is_an_int(arg, want):
  assert config_lib.integral_override(arg) == want


@pytest.mark.parametrize("value", ["2.5", "ten", "inf", "nan"])
def test_a_non_integer_value_of_an_int_key_is_one_line(value):
  with pytest.raises(config_lib.ConfigError,
                     match=rf"^--config.train.num_steps={value}: must be an integer$"):
    config_lib.integral_override(f"--config.train.num_steps={value}")
