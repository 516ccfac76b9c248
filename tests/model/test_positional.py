"""Tests for transformer/model/positional.py: sinusoidal, learned, RoPE, T5 relative buckets, ALiBi, the table."""

import dataclasses
import math
from typing import Any

import hypothesis
import hypothesis.strategies as st
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config import model_config, ModelConfig
from transformer.model import positional
from transformer.schema import KEYS

SETTINGS = hypothesis.settings(max_examples=25, deadline=None)


# ----------------------------------------------------------------------------------------------------
# Sinusoidal
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("length,d", [(50, 16), (7, 5)])
def test_sinusoidal_table_is_the_papers_formula(length, d):
  """sinusoidal_table equals PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(same),
  evaluated entry by entry in float64 (also for an odd d)."""
  want = np.zeros((length, d))
  for pos in range(length):
    for j in range(d):
      angle = pos / 10000 ** (2 * (j // 2) / d)
      want[pos, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
  np.testing.assert_allclose(positional.sinusoidal_table(length, d), want, atol=2e-5)


def test_sinusoidal_of_arbitrary_positions_gathers_table_rows():
  """sinusoidal_lookup for packed rows / cache offsets equals the table rows at those positions."""
  positions = jnp.array([[0, 1, 2, 0, 1], [7, 8, 9, 10, 11]])
  table = positional.sinusoidal_table(12, 8)
  np.testing.assert_allclose(positional.sinusoidal_lookup(positions, 12, 8), table[positions],
                             atol=1e-6)


def test_sinusoidal_lookup_is_the_formula_at_every_position_of_a_row_under_jit():
  """What the models add (rows of a table that is a constant of the compiled program) equals the
  float64 formula at packed positions inside jit, as in a train step (odd d included), also for a
  row longer than max_len (a prompt plus target scored at once: positions up to t - 1 > max_len
  must not be clipped); a concrete position beyond the table is a clear error naming
  model.max_len."""
  def formula(positions, d):
    j = np.arange(d)
    angle = positions[..., None] / 10000 ** (2 * (j // 2) / d)
    return np.where(j % 2 == 0, np.sin(angle), np.cos(angle))
  lookup = jax.jit(positional.sinusoidal_lookup, static_argnums=(1, 2))
  positions = np.array([[0, 1, 2, 0, 1], [7, 8, 9, 10, 15]])
  for d in (8, 5):
    np.testing.assert_allclose(lookup(positions, 16, d), formula(positions, d), atol=2e-5)
  long_row = np.arange(24)[None]  # t = 24 > max_len = 16
  np.testing.assert_allclose(lookup(long_row, 16, 8), formula(long_row, 8), atol=2e-5)
  compiled = jax.jit(positional.sinusoidal_lookup, static_argnums=(1, 2)).lower(
      positions, 16, 8).compile().as_text()
  assert "sine" not in compiled and "cosine" not in compiled  # no per-step sin/cos
  with pytest.raises(ValueError, match="model.max_len=16"):
    positional.sinusoidal_lookup(jnp.array([[0, 16]]), 16, 8)


# ----------------------------------------------------------------------------------------------------
# Learned
# ----------------------------------------------------------------------------------------------------
def test_learned_positions_look_up_rows_and_reject_out_of_range():
  """LearnedPositions returns table row p for position p (logical axes 'length', 'embed'), and a
  concrete position >= max_len is a clear error naming model.max_len."""
  module = positional.LearnedPositions(max_len=6, features=4)
  positions = jnp.array([[0, 1, 2], [5, 0, 3]])
  variables = module.init(jax.random.PRNGKey(0), positions)
  boxed = variables["params"]["embedding"]
  assert boxed.names == ("length", "embed")
  table = boxed.unbox()
  np.testing.assert_array_equal(module.apply(variables, positions), table[positions])
  with pytest.raises(ValueError, match="model.max_len=6"):
    module.apply(variables, jnp.array([[0, 6]]))


# ----------------------------------------------------------------------------------------------------
# RoPE
# ----------------------------------------------------------------------------------------------------
@SETTINGS
@hypothesis.given(seed=st.integers(0, 2**31 - 1), p=st.integers(0, 5000), h=st.sampled_from([2, 8, 16]))
def test_rope_preserves_norms(seed, p, h):
  """RoPE is a rotation: every [h] head vector keeps its norm at any position."""
  x = jax.random.normal(jax.random.PRNGKey(seed), (1, 3, 2, h))
  y = positional.apply_rope(x, jnp.full((1, 3), p))
  np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)


@SETTINGS
@hypothesis.given(seed=st.integers(0, 2**31 - 1), pq=st.integers(0, 300), pk=st.integers(0, 300),
                  shift=st.integers(-300, 2000))
def test_rope_dot_product_depends_only_on_offset(seed, pq, pk, shift):
  """q.k after RoPE depends only on the offset pq - pk: shifting both positions by a constant
  leaves it unchanged (checked for every head)."""
  hypothesis.assume(pq + shift >= 0 and pk + shift >= 0)
  kq, kk = jax.random.split(jax.random.PRNGKey(seed))
  q = jax.random.normal(kq, (1, 1, 2, 16))
  k = jax.random.normal(kk, (1, 1, 2, 16))
  dot = lambda a, b: jnp.sum(positional.apply_rope(q, jnp.array([[a]]))
                             * positional.apply_rope(k, jnp.array([[b]])), -1)
  np.testing.assert_allclose(dot(pq + shift, pk + shift), dot(pq, pk), atol=2e-4, rtol=2e-4)


def test_rope_rotates_half_pairs_by_the_documented_angle():
  """Feature i is paired with i + h/2 and rotated by position * base^(-2i/h) (the documented
  convention), checked against a 2x2 rotation written out in NumPy; position 0 is the identity."""
  h, pos, base = 8, 3, 10000.0
  x = np.random.default_rng(0).normal(size=(1, 1, 1, h)).astype(np.float32)
  want = x.copy()
  for i in range(h // 2):
    a = pos * base ** (-2 * i / h)
    want[..., i] = x[..., i] * math.cos(a) - x[..., i + h // 2] * math.sin(a)
    want[..., i + h // 2] = x[..., i] * math.sin(a) + x[..., i + h // 2] * math.cos(a)
  np.testing.assert_allclose(positional.apply_rope(jnp.asarray(x), jnp.array([[pos]])), want,
                             atol=1e-5)
  np.testing.assert_allclose(positional.apply_rope(jnp.asarray(x), jnp.array([[0]])), x)
  with pytest.raises(ValueError, match="even head dimension"):
    positional.apply_rope(jnp.ones((1, 1, 1, 5)), jnp.zeros((1, 1), int))


@pytest.mark.parametrize("scaling,params", [
    ("none", {}), ("linear", {"factor": 4.0}),
    ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64})])
def test_rope_frequencies_equal_hugging_face(scaling, params):
  """model.rope_scaling's frequencies equal transformers' ROPE_INIT_FUNCTIONS (llama3: Llama 3.1's
  piecewise rule, with an original length short enough that all three bands occur at h=64), and
  a model with them rotates by exactly those frequencies (config_rope_frequencies)."""
  transformers = pytest.importorskip("transformers")
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
  h, base = 64, 500000.0
  hf = transformers.LlamaConfig(hidden_size=4 * h, num_attention_heads=4, head_dim=h,
                                rope_parameters={"rope_type": "default" if scaling == "none"
                                                 else scaling, "rope_theta": base, **params})
  if scaling == "none":
    want = 1.0 / base ** (np.arange(0, h, 2) / h)
  else:
    want = ROPE_INIT_FUNCTIONS[scaling](hf, "cpu")[0].numpy()
  ours = positional.rope_frequencies(h, base, scaling, params.get("factor", 1.0),
                                     params.get("low_freq_factor", 1.0),
                                     params.get("high_freq_factor", 4.0),
                                     params.get("original_max_position_embeddings", 8192))
  np.testing.assert_allclose(ours, want, rtol=1e-6)
  if scaling == "llama3":  # all three bands: kept, divided, interpolated
    plain = 1.0 / base ** (np.arange(0, h, 2) / h)
    ratio = plain / ours
    assert np.isclose(ratio, 1).any() and np.isclose(ratio, 8).any()
    assert ((ratio > 1.01) & (ratio < 7.99)).any()
  cfg = model_config(arch="decoder_only", d_model=4 * h, num_heads=4, positional="rope",
                     rope_base=base, rope_scaling=scaling,
                     rope_scaling_factor=params.get("factor", 8.0),
                     rope_original_max_len=params.get("original_max_position_embeddings", 8192))
  x = np.random.default_rng(0).normal(size=(1, 1, 1, h)).astype(np.float32)
  pos = 37
  angles = pos * want
  x1, x2 = x[..., :h // 2], x[..., h // 2:]
  rotated = np.concatenate([x1 * np.cos(angles) - x2 * np.sin(angles),
                            x2 * np.cos(angles) + x1 * np.sin(angles)], -1)
  got = positional.encoding(cfg).fn(cfg, jnp.asarray(x), jnp.array([[pos]]))
  np.testing.assert_allclose(got, rotated, atol=1e-4)


def test_rope_scaling_needs_rope():
  """model.rope_scaling on another encoding, or llama3's factors the wrong way round, is a
  one-line ConfigError naming the key."""
  from transformer.config import ConfigError
  with pytest.raises(ConfigError, match="model.rope_scaling='linear' needs"):
    model_config(positional="sinusoidal", rope_scaling="linear")
  with pytest.raises(ConfigError, match="model.rope_high_freq_factor=1.0 must be >"):
    model_config(positional="rope", rope_scaling="llama3", rope_high_freq_factor=1.0)


# ----------------------------------------------------------------------------------------------------
# T5 relative position buckets
# ----------------------------------------------------------------------------------------------------
def t5_bucket_reference(rel, bidirectional, num_buckets, max_distance):
  """The T5 bucketing rule for one offset (key - query), written from its description."""
  buckets, offset = num_buckets, 0
  if bidirectional:
    buckets //= 2
    if rel > 0:  # keys after the query use the upper half
      offset = buckets
    distance = abs(rel)
  else:
    distance = max(-rel, 0)
  exact = buckets // 2
  if distance < exact:
    return offset + distance
  log_bucket = exact + int(math.log(distance / exact) / math.log(max_distance / exact) * (buckets - exact))
  return offset + min(log_bucket, buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (64, 256)])
def test_relative_buckets_match_t5_formula(bidirectional, num_buckets, max_distance):
  """relative_position_bucket equals a scalar float64 reimplementation of the T5 rule for every
  offset in [-600, 600]."""
  rel = np.arange(-600, 601)
  want = [t5_bucket_reference(int(r), bidirectional, num_buckets, max_distance) for r in rel]
  got = positional.relative_position_bucket(jnp.asarray(rel), bidirectional, num_buckets, max_distance)
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_buckets_monotone_exact_and_causal_folding(bidirectional):
  """Buckets are non-decreasing in |offset| on each side, exact (one per offset) for small offsets,
  saturate beyond max_distance, and in causal mode every future key (offset > 0) maps to bucket 0."""
  nb, md = 32, 128
  for sign in (-1, 1):
    b = np.array(positional.relative_position_bucket(sign * jnp.arange(0, 400), bidirectional, nb, md))
    assert np.all(np.diff(b) >= 0)
    if sign == 1 and not bidirectional:
      assert np.all(b == 0)
      continue
    half = nb // 2 if bidirectional else nb
    assert len(set(b[:half // 2])) == half // 2  # exact region
    last = half - 1 + (half if sign == 1 else 0)  # keys after the query use the upper half
    assert np.all(b[md:] == last)  # saturation in the last bucket of the side


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets", [4, 8, 32])
def test_relative_buckets_at_the_exact_range_boundary(bidirectional, num_buckets):
  """max_distance must exceed max_exact, the offsets with their own bucket (num_buckets // 4
  bidirectional, // 2 causal): at or below it log(max_distance / max_exact) <= 0 made NaN biases
  or buckets running backwards, so it is a one-line ValueError naming max_distance; just above it
  the buckets are in range, non-decreasing in |offset| and exact below max_exact."""
  exact = positional.max_distance_bound(num_buckets, bidirectional)
  assert exact == (num_buckets // 4 if bidirectional else num_buckets // 2)
  for bad in (exact, max(exact // 2, 1)):
    with pytest.raises(ValueError, match=f"max_distance={bad} must be > {exact}"):
      positional.relative_position_bucket(jnp.arange(-40, 41), bidirectional, num_buckets, bad)
  half = num_buckets // 2 if bidirectional else num_buckets
  for sign in ((-1, 1) if bidirectional else (-1,)):
    b = np.array(positional.relative_position_bucket(sign * jnp.arange(0, 400), bidirectional,
                                                      num_buckets, exact + 1))
    if sign == 1:  # keys after the query use the upper half; offset 0 is bucket 0 either way
      b[1:] -= half
    assert b.min() >= 0 and b.max() == half - 1 and np.all(np.diff(b) >= 0)
    np.testing.assert_array_equal(b[:exact], np.arange(exact))


def test_relative_position_bias_rejects_max_distance_in_the_exact_range():
  """The issue's case: RelativePositionBias(32, 8, 2) (bidirectional: 8 exact offsets) gave 24 NaN
  biases out of 288; it is now a ValueError, and max_distance 9 gives finite biases."""
  qp = jnp.arange(12)[None]
  with pytest.raises(ValueError, match="max_distance=8 must be > 8"):
    positional.RelativePositionBias(32, 8, 2).init(jax.random.key(0), qp, qp)
  module = positional.RelativePositionBias(32, 9, 2)
  assert np.all(np.isfinite(module.apply(module.init(jax.random.key(0), qp, qp), qp, qp)))


@pytest.mark.parametrize("num_buckets,max_distance,bidirectional", [(8, 16, False), (32, 128, True),
                                                                    (32, 128, False)])
def test_relative_position_bias_gathers_per_head_table(num_buckets, max_distance, bidirectional):
  """RelativePositionBias returns [b, n, t, s] = table[bucket(k_pos - q_pos), head] exactly, with
  the T5 reference's buckets (the default 32 buckets / 128 included, bitwise), using the given
  positions (packed rows restart at 0), with logical axes ('relpos_buckets', 'heads')."""
  module = positional.RelativePositionBias(num_buckets=num_buckets, max_distance=max_distance,
                                           num_heads=3, bidirectional=bidirectional)
  qp = jnp.array([[0, 1, 2, 0, 1, 150, 3, 40]])
  variables = module.init(jax.random.PRNGKey(0), qp, qp)
  boxed = variables["params"]["rel_embedding"]
  assert boxed.names == ("relpos_buckets", "heads")
  table = np.asarray(boxed.unbox())
  got = module.apply(variables, qp, qp)
  assert got.shape == (1, 3, 8, 8)
  for n in range(3):
    for i in range(8):
      for j in range(8):
        bucket = t5_bucket_reference(int(qp[0, j] - qp[0, i]), bidirectional, num_buckets,
                                     max_distance)
        assert got[0, n, i, j] == table[bucket, n]


# ----------------------------------------------------------------------------------------------------
# ALiBi
# ----------------------------------------------------------------------------------------------------
def test_alibi_slopes_power_of_two():
  """For 8 heads the slopes are the paper's geometric sequence 1/2, 1/4, ..., 1/256 = 2^(-8i/8)."""
  np.testing.assert_allclose(positional.alibi_slopes(8), [2.0 ** -i for i in range(1, 9)])
  np.testing.assert_allclose(positional.alibi_slopes(4), [2.0 ** (-2 * i) for i in range(1, 5)])


def test_alibi_slopes_non_power_of_two():
  """For 6 heads (the paper's rule): the 4-head slopes 1/4, 1/16, 1/64, 1/256, then every other
  8-head slope, 1/2 and 1/8; for 12 heads the 8-head slopes then 2^(-0.5), 2^(-1.5), 2^(-2.5), 2^(-3.5)."""
  np.testing.assert_allclose(positional.alibi_slopes(6), [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8])
  want12 = [2.0 ** -i for i in range(1, 9)] + [2.0 ** -(i + 0.5) for i in range(4)]
  np.testing.assert_allclose(positional.alibi_slopes(12), want12, rtol=1e-6)
  with pytest.raises(ValueError, match="num_heads"):
    positional.alibi_slopes(0)


def test_alibi_bias_is_negative_slope_times_distance():
  """alibi_bias[b, n, i, j] = -slope[n] * |q_pos[i] - k_pos[j]|, symmetric in the offset's sign."""
  slopes = positional.alibi_slopes(4)
  qp = jnp.array([[0, 1, 2, 0]])
  kp = jnp.array([[0, 1, 2, 0, 5]])
  got = np.asarray(positional.alibi_bias(qp, kp, slopes))
  assert got.shape == (1, 4, 4, 5)
  for n in range(4):
    for i in range(4):
      for j in range(5):
        assert got[0, n, i, j] == pytest.approx(-slopes[n] * abs(int(qp[0, i]) - int(kp[0, j])))


# ----------------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------------
class _Apply(nn.Module):
  """Runs a table entry's function inside a module (its parameters, if any, live here)."""
  cfg: Any

  @nn.compact
  def __call__(self, positions, x):
    encoding = positional.encoding(self.cfg)
    if encoding.kind == "absolute":
      return encoding.fn(self.cfg, positions)
    if encoding.kind == "bias":
      return encoding.fn(self.cfg, positions, positions, False)
    if encoding.kind == "rotary":
      return encoding.fn(self.cfg, x, positions)
    return x


# The config keys each encoding reads (besides d_model, num_heads and max_len).
ENCODING_KEYS = {"rope": ("rope_base",), "shaw": ("relative_max_distance",),
                 "relative": ("relative_num_buckets", "relative_max_distance")}


@pytest.mark.parametrize("name", list(positional.ENCODINGS))
def test_every_table_entry_has_its_kinds_signature(name):
  """Each entry: a known kind, config keys that exist, a valid config
  choice; its function returns its kind's shape: [b, t, d] (absolute), [b, n, t, s] float32
  (bias), x's shape (rotary); translating all positions leaves a bias unchanged."""
  cfg = model_config(positional=name, d_model=16, num_heads=2, max_len=64)
  encoding = positional.encoding(cfg)
  assert encoding.kind in ("absolute", "bias", "rotary", "none")
  fields = {f.name for f in dataclasses.fields(ModelConfig)}
  assert set(ENCODING_KEYS.get(name, ())) <= fields
  assert name in KEYS["model.positional"].choices()
  positions = jnp.array([[0, 1, 2, 0, 1, 5]])
  x = jnp.asarray(np.random.default_rng(0).normal(size=(1, 6, 2, 8)), jnp.float32)
  module = _Apply(cfg)
  variables = module.init(jax.random.key(0), positions, x)
  out = module.apply(variables, positions, x)
  want = {"absolute": (1, 6, 16), "bias": (1, 2, 6, 6)}.get(encoding.kind, x.shape)
  assert out.shape == want
  if encoding.kind == "bias":
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(module.apply(variables, positions + 7, x), out, atol=1e-6)


def test_shaw_is_a_clipped_relative_table_and_translation_invariant():
  """'shaw' equals a NumPy lookup table[clip(k_pos - q_pos, -K, K) + K, head] (K =
  relative_max_distance) as [b, n, t, s]; shifting every position by the same amount changes
  nothing, and distances beyond K share the clipped entry."""
  cfg = model_config(positional="shaw", d_model=16, num_heads=2, relative_max_distance=3)
  module = _Apply(cfg)
  qp = jnp.array([[0, 1, 2, 0, 1, 9]])
  variables = module.init(jax.random.key(0), qp, None)
  table = np.asarray(variables["params"]["relative_bias"]["embedding"].unbox())
  assert table.shape == (7, 2)
  got = np.asarray(module.apply(variables, qp, None))
  q = np.asarray(qp[0])
  want = np.zeros((1, 2, 6, 6), np.float32)
  for n in range(2):
    for i in range(6):
      for j in range(6):
        want[0, n, i, j] = table[min(max(q[j] - q[i], -3), 3) + 3, n]
  np.testing.assert_allclose(got, want, atol=0)
  np.testing.assert_allclose(module.apply(variables, qp + 11, None), got, atol=0)
  np.testing.assert_allclose(got[0, :, 0, 5], table[6], atol=0)  # distance 9 clipped to 3
