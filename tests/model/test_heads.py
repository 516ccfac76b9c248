"""The encoder-only model (transformer.model.models.EncoderOnly, transformer/model/heads.py): its heads,
pooling that ignores padding and row neighbours, and every encoder knob, against naive NumPy
references and invariance properties."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config import model_config
from transformer.model import heads, models, scoring
from model_fixtures import _stack_layers

V, C = 17, 5
BASE = dict(arch="encoder_only", vocab_size=V, num_classes=C, d_model=32, num_heads=4,
            num_kv_heads=2, mlp_dim=64, num_encoder_layers=2, max_len=64, dropout_rate=0.0)


def _setup(**overrides):
  return _setup_cached(tuple(sorted(overrides.items())))


@functools.cache
def _setup_cached(overrides):
  cfg = model_config(**(BASE | dict(overrides)))
  model = models.build_model(cfg)
  params = scoring.init_params(model, jax.random.key(0), models.example_batch(cfg))
  return cfg, model, params


@functools.cache
def _compiled(model):
  """Compiled batch_logits: a few compiles beat thousands of eager dispatches on a busy CPU."""
  return jax.jit(functools.partial(models.batch_logits, model))


def _logits(model, params, **batch):
  return np.asarray(_compiled(model)(params, {k: jnp.asarray(v) for k, v in batch.items()}))


ROW = np.array([[2, 5, 9, 7, 11, 1]])  # BOS, four ordinary ids, EOS


@pytest.mark.parametrize("positional,pooling", [
    ("sinusoidal", "first"), ("rope", "mean"), ("relative", "first")])
def test_classification_ignores_padding(positional, pooling):
  """Appending pad tokens to a row leaves its class logits unchanged (both poolings)."""
  _, model, params = _setup(head="classify", pooling=pooling, positional=positional)
  alone = _logits(model, params, inputs=ROW)
  padded = _logits(model, params, inputs=np.pad(ROW, ((0, 0), (0, 7))))
  assert alone.shape == (1, 1, C)
  np.testing.assert_allclose(padded, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pooling", ["first", "mean"])
def test_packed_examples_classify_as_if_alone(pooling):
  """Two examples packed in one row (segments 1, 2; positions restart) get the logits each gets
  alone: pooling and attention never mix row neighbours; a padding slot (segment 0) is zeros."""
  _, model, params = _setup(head="classify", pooling=pooling, positional="rope")
  a, b = [2, 5, 9, 1], [2, 7, 7, 11, 4, 1]
  packed = dict(inputs=np.array([a + b + [0, 0]]),
                inputs_segment_ids=np.array([[1] * 4 + [2] * 6 + [0, 0]]),
                inputs_positions=np.array([list(range(4)) + list(range(6)) + [0, 0]]),
                targets_segment_ids=np.array([[1, 2, 0]]))
  got = _logits(model, params, **packed)
  np.testing.assert_allclose(got[0, 0], _logits(model, params, inputs=np.array([a]))[0, 0],
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[0, 1], _logits(model, params, inputs=np.array([b]))[0, 0],
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[0, 2], 0.0, atol=1e-6)  # no bias: a zero vector's logits


def test_pool_matches_a_naive_loop():
  """heads.pool against a per-slot Python loop over segment ids (first token and mean)."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 7, 3)).astype(np.float32)
  seg = np.array([[1, 1, 2, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
  slots = np.array([[1, 2, 0], [1, 0, 0]])
  for pooling in ("first", "mean"):
    got = np.asarray(heads.pool(jnp.asarray(x), jnp.asarray(seg), jnp.asarray(slots), pooling))
    for b in range(2):
      for t in range(3):
        at = np.flatnonzero(seg[b] == slots[b, t]) if slots[b, t] else []
        want = np.zeros(3) if not len(at) else (x[b, at[0]] if pooling == "first"
                                                else x[b, at].mean(0))
        np.testing.assert_allclose(got[b, t], want, rtol=1e-6, atol=1e-6)


def test_tied_mlm_head_is_the_embedding_table_and_untied_has_its_own():
  """Tied: no head parameters, logits = encoder output @ E^T (vocab V); untied: head/logits_dense."""
  cfg, model, params = _setup(head="mlm", tie_embeddings=True)
  assert set(params) == {"token_embed", "encoder"}
  encoded = model.apply({"params": params}, jnp.asarray(ROW), method=lambda m, x: m.encoder(x))
  want = np.asarray(encoded) @ np.asarray(params["token_embed"]["embedding"]).T
  np.testing.assert_allclose(_logits(model, params, inputs=ROW), want, rtol=1e-4, atol=1e-4)
  _, _, untied = _setup(head="mlm", tie_embeddings=False)
  assert untied["head"]["logits_dense"]["kernel"].shape == (cfg.d_model, V)


def test_tagging_head_gives_one_distribution_per_token():
  _, model, params = _setup(head="tag")
  assert _logits(model, params, inputs=ROW).shape == (1, ROW.shape[1], C)


KNOBS = [  # between them: every positional kind, both norms and placements, gated FFNs, GQA/MQA
    dict(positional="rope", norm_position="pre", norm="rmsnorm", ffn="swiglu", num_kv_heads=1),
    dict(positional="relative", ffn="geglu", head_dim=16, v_head_dim=4, attention_impl="fused"),
    dict(positional="alibi", norm_position="post", ffn="gelu", use_bias=False, dtype="bfloat16"),
]


# The first knob set in the default suite, the other two (~20-30 s each) under -m slow: the
# encoder-only model is the encoder stack with a head, and that stack's positional kinds, norms,
# FFNs, head dims, fused attention and scan/remat equality are the encoder-decoder's, tested in
# tests/model/test_models_*.py and test_positional.py, test_layers.py, test_attention.py.
@pytest.mark.parametrize("knobs,head", [
    pytest.param(knobs, head, marks=[pytest.mark.slow] if i else [])
    for i, (knobs, head) in enumerate(zip(KNOBS, ["mlm", "classify", "tag"]))],
                         ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items())
                         if isinstance(k, dict) else k)
def test_every_encoder_knob_works_and_scan_remat_match_unrolled(knobs, head):
  """Each knob set builds, gives finite logits and gradients, and scan_layers + remat give the
  unrolled model's logits from the same (stacked) parameters."""
  cfg, model, params = _setup(head=head, **knobs)
  batch = dict(inputs=np.pad(ROW, ((0, 0), (0, 2))))
  logits = _logits(model, params, **batch)
  assert np.isfinite(logits).all()
  grads = jax.jit(jax.grad(lambda p: jnp.sum(models.batch_logits(model, p, {"inputs": jnp.asarray(
      batch["inputs"])}) ** 2)))(params)
  assert all(np.isfinite(np.asarray(g, np.float32)).all() for g in jax.tree.leaves(grads))
  scanned = models.build_model(dataclasses.replace(cfg, scan_layers=True, remat="dots"))
  tol = 2e-2 if knobs.get("dtype") == "bfloat16" else 1e-5
  np.testing.assert_allclose(_logits(scanned, _stack_layers(params), **batch), logits,
                             rtol=tol, atol=tol)


def test_mlm_loss_counts_only_the_masked_positions():
  """The eval step's loss over an MLM batch (targets 0 where nothing is masked) is exactly the
  naive NumPy cross-entropy summed over the masked positions, and its weight their count."""
  _, model, params = _setup(head="mlm")
  inputs = np.array([[2, 16, 9, 16, 11, 1, 0, 0], [2, 4, 5, 6, 16, 8, 9, 1]])
  targets = np.array([[0, 5, 0, 7, 0, 0, 0, 0], [0, 0, 0, 0, 7, 0, 0, 0]])
  sums = jax.jit(scoring.make_eval_step(model))(params, dict(inputs=jnp.asarray(inputs),
                                                  targets=jnp.asarray(targets)))
  logits = _logits(model, params, inputs=inputs).astype(np.float64)
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  rows, cols = np.nonzero(targets)
  want = -log_p[rows, cols, targets[rows, cols]].sum()
  assert float(sums["weight_sum"]) == 3
  np.testing.assert_allclose(float(sums["loss_sum"]), want, rtol=1e-5)


def test_tagging_metrics_count_real_tokens_and_give_macro_f1():
  """Tagging: BOS/EOS/padding (tag 0) carry no weight; the per-class counts give the macro F1 of
  a naive count over the real tokens."""
  _, model, params = _setup(head="tag")
  inputs = np.array([[2, 5, 9, 7, 1, 0], [2, 4, 1, 0, 0, 0]])
  tags = np.array([[0, 2, 3, 2, 0, 0], [0, 4, 0, 0, 0, 0]])
  sums = jax.device_get(jax.jit(scoring.make_eval_step(model))(
      params, dict(inputs=jnp.asarray(inputs), targets=jnp.asarray(tags))))
  assert float(sums["weight_sum"]) == 4
  pred = _logits(model, params, inputs=inputs).argmax(-1)[tags != 0]
  true = tags[tags != 0]
  f1s = [2 * np.sum((pred == c) & (true == c)) / (np.sum(pred == c) + np.sum(true == c))
         for c in range(C) if np.any(pred == c) or np.any(true == c)]
  metrics = scoring.teacher_forced_metrics(sums)
  np.testing.assert_allclose(metrics["f1"], np.mean(f1s))
  np.testing.assert_allclose(metrics["accuracy"], np.mean(pred == true))
