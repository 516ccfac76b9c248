"""Tests for transformer/train/optim.py: schedules against closed forms, decay mask, clipping, accumulation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import base
from transformer.config import from_configdict
from transformer.train import optim
from transformer.train.hyper import Hyper


def train_cfg(**overrides):
  """base.py's train section with overrides, validated by transformer.config."""
  c = base.get_config()
  c.train.update(overrides)
  return from_configdict(c).train


def test_rsqrt_matches_paper_formula():
  """The Noam schedule equals d^-0.5 * min(s^-0.5, s * w^-1.5) with s = count + 1, peak at s = w."""
  sched = optim.make_schedule(train_cfg(schedule="rsqrt", learning_rate=2.0, warmup_steps=4000),
                              512)
  for count in [0, 1, 99, 3998, 3999, 4000, 10_000, 99_999]:
    s = count + 1
    expected = 2.0 * 512**-0.5 * min(s**-0.5, s * 4000**-1.5)
    np.testing.assert_allclose(float(sched(count)), expected, rtol=1e-6)
  lrs = np.array([float(sched(c)) for c in range(3990, 4010)])
  assert np.argmax(lrs) + 3990 == 3999  # count 3999 is the paper's step 4000
  assert float(sched(0)) > 0  # the first update is not wasted


def test_rsqrt_without_warmup_is_inverse_sqrt():
  """warmup_steps=0 gives learning_rate * d^-0.5 * s^-0.5 (no division by zero)."""
  sched = optim.make_schedule(train_cfg(schedule="rsqrt", learning_rate=1.0, warmup_steps=0), 64)
  for count in [0, 3, 100]:
    np.testing.assert_allclose(float(sched(count)), 64**-0.5 * (count + 1)**-0.5, rtol=1e-6)


def test_warmup_cosine_closed_form():
  """Linear warmup to the peak, then a half cosine reaching min_ratio * peak at num_steps."""
  cfg = train_cfg(schedule="warmup_cosine", learning_rate=1e-3, warmup_steps=10, num_steps=110,
                  min_learning_rate_ratio=0.1)
  sched = optim.make_schedule(cfg, 128)
  peak, low = 1e-3, 1e-4
  for count in [0, 4, 8]:
    np.testing.assert_allclose(float(sched(count)), peak * (count + 1) / 10, rtol=1e-6)
  for s in [10, 35, 60, 85, 110]:
    expected = low + (peak - low) * 0.5 * (1 + math.cos(math.pi * (s - 10) / 100))
    np.testing.assert_allclose(float(sched(s - 1)), expected, rtol=1e-5)
  np.testing.assert_allclose(float(sched(500)), low, rtol=1e-6)  # stays at the floor


@pytest.mark.parametrize("name", ["warmup_cosine", "warmup_linear"])
def test_run_shorter_than_its_warmup_only_ramps(name):
  """num_steps <= warmup_steps (a shortened smoke run): lr(s) = peak * s / warmup at every step,
  the same values as the full-length run's first steps, with no division by zero."""
  short = optim.make_schedule(train_cfg(schedule=name, learning_rate=2.0, warmup_steps=100,
                                        num_steps=20), 64)
  full = optim.make_schedule(train_cfg(schedule=name, learning_rate=2.0, warmup_steps=100,
                                       num_steps=1000), 64)
  counts = np.arange(20)
  np.testing.assert_allclose([float(short(c)) for c in counts], 2.0 * (counts + 1) / 100, rtol=1e-6)
  np.testing.assert_allclose([float(short(c)) for c in counts], [float(full(c)) for c in counts])


def test_warmup_linear_and_constant():
  """warmup_linear decays linearly to the floor at num_steps; constant holds the peak after warmup."""
  lin = optim.make_schedule(train_cfg(schedule="warmup_linear", learning_rate=1.0, warmup_steps=4,
                                      num_steps=14, min_learning_rate_ratio=0.0), 8)
  np.testing.assert_allclose([float(lin(c)) for c in [0, 3, 8, 13, 20]],
                             [0.25, 1.0, 0.5, 0.0, 0.0], atol=1e-6)
  const = optim.make_schedule(train_cfg(schedule="constant", learning_rate=3.0, warmup_steps=3), 8)
  np.testing.assert_allclose([float(const(c)) for c in [0, 1, 2, 50]], [1.0, 2.0, 3.0, 3.0],
                             rtol=1e-6)


def test_bad_schedule_and_optimizer_names_the_key():
  """Unknown names fail with a one-line error naming the config key."""
  cfg = base.get_config().train
  cfg.schedule = "cosine_typo"
  with pytest.raises(ValueError, match=r"train\.schedule='cosine_typo'"):
    optim.make_schedule(cfg, 8)
  cfg = base.get_config().train
  cfg.optimizer = "lamb"
  with pytest.raises(ValueError, match=r"train\.optimizer='lamb'"):
    optim.make_optimizer(cfg, 8)


def toy_params():
  """A flax-like param tree: dense kernels/biases, norms, an embedding, a scanned (stacked) layer."""
  return {
      "Embed_0": {"embedding": jnp.ones((5, 4))},
      "encoder": {
          "layers": {  # scan_layers: leading axis 2; biases are 2-D here
              "attention": {"query": {"kernel": jnp.ones((2, 4, 4)), "bias": jnp.ones((2, 4))}},
              "pre_attention_norm": {"scale": jnp.ones((2, 4))},
          },
          "encoder_norm": {"scale": jnp.ones((4,)), "bias": jnp.ones((4,))},
      },
      "Dense_0": {"kernel": jnp.ones((4, 3)), "bias": jnp.ones((3,))},
      "pos_embedding": jnp.ones((7, 4)),
  }


def test_weight_decay_mask_rules():
  """Kernels are decayed; norms, biases and embeddings only when their option is on."""
  params = toy_params()
  mask = optim.weight_decay_mask(train_cfg())(params)
  assert mask["Dense_0"]["kernel"] and mask["encoder"]["layers"]["attention"]["query"]["kernel"]
  assert not mask["Dense_0"]["bias"] and not mask["encoder"]["layers"]["attention"]["query"]["bias"]
  assert not mask["encoder"]["layers"]["pre_attention_norm"]["scale"]
  assert not mask["encoder"]["encoder_norm"]["scale"]
  assert not mask["Embed_0"]["embedding"] and not mask["pos_embedding"]
  both = optim.weight_decay_mask(train_cfg(weight_decay_norms_and_biases=True,
                                           weight_decay_embeddings=True))(params)
  assert all(jax.tree.leaves(both))


def test_weight_decay_mask_on_the_real_model():
  """On build_model's (boxed) param tree exactly the kernels are decayed by default."""
  from transformer.config import model_config  # pylint: disable=g-import-not-at-top
  from transformer.model.models import build_model  # pylint: disable=g-import-not-at-top
  cfg = model_config(vocab_size=11, source_vocab_size=11, d_model=8, num_heads=2, mlp_dim=16,
                     num_encoder_layers=1, num_decoder_layers=1, ffn="swiglu")
  tokens = jnp.ones((1, 3), jnp.int32)
  params = jax.eval_shape(lambda: build_model(cfg).init(jax.random.key(0), tokens, tokens))
  params = params["params"]
  mask = optim.weight_decay_mask(train_cfg())(params)
  flat = jax.tree_util.tree_flatten_with_path(mask)[0]
  assert len(flat) > 20
  for path, decayed in flat:
    assert decayed == jax.tree_util.keystr(path).endswith("['kernel'].value"), path


def test_adamw_decays_only_masked_params():
  """With zero gradients AdamW's update is exactly -lr * wd * param on decayed leaves, 0 elsewhere."""
  cfg = train_cfg(optimizer="adamw", schedule="constant", learning_rate=0.5, warmup_steps=0,
                  weight_decay=0.1)
  tx = optim.make_optimizer(cfg, 4)
  params = toy_params()
  updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
  mask = optim.weight_decay_mask(cfg)(params)
  for u, p, m in zip(jax.tree.leaves(updates), jax.tree.leaves(params), jax.tree.leaves(mask)):
    np.testing.assert_allclose(u, -0.5 * 0.1 * p if m else 0 * p, rtol=1e-6)


def test_adam_matches_reference_adam_with_paper_settings():
  """adam with b1 0.9, b2 0.98, eps 1e-9 equals a hand-written bias-corrected Adam for 3 steps."""
  cfg = train_cfg(optimizer="adam", schedule="constant", learning_rate=0.01, warmup_steps=0)
  tx = optim.make_optimizer(cfg, 4)
  w = jnp.array([1.0, -2.0, 3.0])
  state, m, v, ref = tx.init(w), np.zeros(3), np.zeros(3), np.array(w)
  for t in range(1, 4):
    g = np.array([0.1, -0.3, 0.7]) * t
    upd, state = tx.update(jnp.asarray(g, jnp.float32), state, w)
    w = optax.apply_updates(w, upd)
    m, v = 0.9 * m + 0.1 * g, 0.98 * v + 0.02 * g * g
    ref = ref - 0.01 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.98**t)) + 1e-9)
  np.testing.assert_allclose(w, ref, rtol=1e-5)


def test_global_norm_clipping():
  """With grad_clip=1, SGD's update is the gradient rescaled to global norm 1; small grads pass."""
  cfg = train_cfg(optimizer="sgd", momentum=0.0, schedule="constant", learning_rate=1.0,
                  warmup_steps=0, grad_clip=1.0)
  tx = optim.make_optimizer(cfg, 4)
  params = {"a": jnp.zeros(2), "b": jnp.zeros(1)}
  grads = {"a": jnp.array([3.0, 0.0]), "b": jnp.array([4.0])}  # global norm 5
  upd, _ = tx.update(grads, tx.init(params), params)
  np.testing.assert_allclose(upd["a"], [-0.6, 0.0], rtol=1e-6)
  np.testing.assert_allclose(upd["b"], [-0.8], rtol=1e-6)
  small = {"a": jnp.array([0.3, 0.0]), "b": jnp.array([0.4])}
  upd, _ = tx.update(small, tx.init(params), params)
  np.testing.assert_allclose(upd["b"], [-0.4], rtol=1e-6)


def test_sgd_momentum_and_adafactor_run():
  """SGD momentum accumulates g + 0.9 * g on the 2nd step; adafactor makes finite descent steps."""
  cfg = train_cfg(optimizer="sgd", momentum=0.9, schedule="constant", learning_rate=1.0,
                  warmup_steps=0)
  tx = optim.make_optimizer(cfg, 4)
  p = jnp.zeros(2)
  g = jnp.array([1.0, 2.0])
  state = tx.init(p)
  _, state = tx.update(g, state, p)
  upd, _ = tx.update(g, state, p)
  np.testing.assert_allclose(upd, -1.9 * g, rtol=1e-6)
  tx = optim.make_optimizer(train_cfg(optimizer="adafactor", weight_decay=0.01), 4)
  params = toy_params()
  grads = jax.tree.map(jnp.ones_like, params)
  upd, _ = tx.update(grads, tx.init(params), params)
  assert all(bool(jnp.all(jnp.isfinite(u)) & jnp.all(u < 0)) for u in jax.tree.leaves(upd))


def test_gradient_accumulation_equals_large_batch():
  """Summing loss/weight/grad sums over 4 micro-batches (uneven padding) gives the big batch's update."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(8, 5)), jnp.float32)
  y = jnp.asarray(rng.normal(size=(8,)), jnp.float32)
  weights = jnp.asarray([1, 1, 1, 0, 1, 0, 0, 1], jnp.float32)  # padding differs per micro-batch
  params = {"w": jnp.asarray(rng.normal(size=(5,)), jnp.float32), "b": jnp.zeros(())}

  def loss_sums(p, batch):
    err = batch["x"] @ p["w"] + p["b"] - batch["y"]
    return jnp.sum(batch["weights"] * err**2), jnp.sum(batch["weights"])

  loss_and_grad = jax.value_and_grad(loss_sums, has_aux=True)
  batch = {"x": x, "y": y, "weights": weights}
  (big_loss, big_weight), big_grads = loss_and_grad(params, batch)
  micro = optim.split_micro_batches(batch, 4)

  def fn(p, mb):
    (loss, weight), grads = loss_and_grad(p, mb)
    return (loss, weight), grads

  loss, weight, grads = jax.jit(lambda p, mb: optim.accumulate_gradients(fn, p, mb))(params, micro)
  np.testing.assert_allclose(loss / weight, big_loss / big_weight, rtol=1e-6)
  tx = optim.make_optimizer(train_cfg(optimizer="adamw", weight_decay=0.01, grad_clip=1.0), 8)
  state = tx.init(params)
  upd_big, _ = tx.update(jax.tree.map(lambda g: g / big_weight, big_grads), state, params)
  upd_acc, _ = tx.update(jax.tree.map(lambda g: g / weight, grads), state, params)
  for a, b in zip(jax.tree.leaves(upd_acc), jax.tree.leaves(upd_big)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9)
  with pytest.raises(ValueError, match="grad_accum_steps=3"):
    optim.split_micro_batches(batch, 3)


def test_lion_matches_numpy_reference():
  """Lion (Chen et al. 2023, Algorithm 2) in NumPy: u = sign(b1 m + (1 - b1) g),
  p <- p - lr (u + wd p), m <- b2 m + (1 - b2) g; three steps with decoupled weight decay."""
  cfg = train_cfg(optimizer="lion", b1=0.9, b2=0.99, learning_rate=0.1, schedule="constant",
                  warmup_steps=0, weight_decay=0.5, weight_decay_norms_and_biases=True)
  tx = optim.make_optimizer(cfg, 4)
  rng = np.random.default_rng(0)
  p = {"kernel": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32)}
  want, m = np.asarray(p["kernel"], np.float64), np.zeros((3, 2))
  state = tx.init(p)
  for _ in range(3):
    g = rng.normal(size=(3, 2))
    u = np.sign(0.9 * m + 0.1 * g)
    want = want - 0.1 * (u + 0.5 * want)
    m = 0.99 * m + 0.01 * g
    upd, state = tx.update({"kernel": jnp.asarray(g, jnp.float32)}, state, p)
    p = optax.apply_updates(p, upd)
  np.testing.assert_allclose(p["kernel"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer", list(optim.OPTIMIZERS))
def test_state_structure_independent_of_clip_and_decay(optimizer):
  """Turning grad_clip / weight_decay on or off keeps the optimizer-state tree (resume works)."""
  params = toy_params()
  structure = lambda **kw: jax.tree.structure(  # pylint: disable=unnecessary-lambda-assignment
      optim.make_optimizer(train_cfg(optimizer=optimizer, **kw), 4).init(params))
  assert structure() == structure(weight_decay=0.1, grad_clip=1.0) == structure(grad_clip=0.5)


@pytest.mark.parametrize("schedule", ["rsqrt", "warmup_cosine", "warmup_linear", "constant"])
def test_traced_warmup_equals_the_python_one(schedule):
  """A member's warmup_steps traced as a float32 array (members.py) gives each schedule's
  Python-int values, with and without warmup (0 = off)."""
  counts = jnp.array([0, 1, 4, 5, 6, 30, 99])
  for warmup in (0, 5):
    tc = train_cfg(schedule=schedule, warmup_steps=warmup, num_steps=100)
    want = jax.vmap(optim.make_schedule(tc, 64))(counts)
    traced = jax.jit(lambda w, tc=tc: jax.vmap(optim.make_schedule(
        tc, 64, Hyper(warmup_steps=w)))(counts))
    np.testing.assert_allclose(traced(jnp.float32(warmup)), want, rtol=1e-6)


@pytest.mark.parametrize("optimizer", ["adam", "adamw", "lion"])
def test_traced_decay_clip_and_betas_equal_the_python_ones(optimizer):
  """weight_decay, grad_clip, b1, b2 traced as arrays give the Python values' updates; a traced
  0 switches decay and clipping off; the optimizer state has the same tree either way."""
  params = {"dense": {"kernel": jnp.arange(6.0).reshape(2, 3) / 7}}
  grads = {"dense": {"kernel": jnp.array([[3.0, -1.0, 0.5], [2.0, 0.0, -4.0]])}}
  for values in ({"weight_decay": 0.1, "grad_clip": 0.5, "b1": 0.8, "b2": 0.95},
                 {"weight_decay": 0.0, "grad_clip": 0.0, "b1": 0.9, "b2": 0.98}):
    tc = train_cfg(optimizer=optimizer, schedule="constant", warmup_steps=0, **values)
    tx = optim.make_optimizer(tc, 64)
    state = tx.init(params)
    want, _ = tx.update(grads, state, params)

    @jax.jit
    def traced(arrays, state, tc=tc):
      tx = optim.make_optimizer(tc, 64, Hyper(**arrays))
      assert jax.tree.structure(tx.init(params)) == jax.tree.structure(state)
      return tx.update(grads, state, params)[0]

    got = traced({k: jnp.float32(v) for k, v in values.items()}, state)
    np.testing.assert_allclose(got["dense"]["kernel"], want["dense"]["kernel"], rtol=2e-6,
                               atol=1e-9)
