"""train.loss_chunk_tokens: losses.chunked_cross_entropy equals cross_entropy over the whole
batch's logits (loss, z-loss and weight sums, and their gradients), alone and through a model's
output layer (models.batch_hidden + models.vocab_projection), tied or not, and in a train step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import g2p
from transformer.config import ConfigError, from_configdict, model_config
from transformer.model import losses, models
from transformer.train import optim, steps

RNG = np.random.default_rng(0)


def close(got, want):
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6), got, want)


@pytest.mark.parametrize("chunk_tokens", [7, 12, 1000])
def test_chunked_equals_the_plain_loss_and_gradients(chunk_tokens):
  """3 rows x 10 positions: chunks of 2 positions (5 chunks), of 4 (10 padded to 12), or one;
  label smoothing, z-loss and weights with zeros; gradients for the hidden states and the
  projection's weights."""
  hidden = jnp.asarray(RNG.normal(size=(3, 10, 8)), jnp.float32)
  w_out = jnp.asarray(RNG.normal(size=(8, 50)), jnp.float32)
  targets = jnp.asarray(RNG.integers(0, 50, (3, 10)), jnp.int32)
  weights = jnp.asarray(RNG.integers(0, 3, (3, 10)), jnp.float32)
  kw = dict(label_smoothing=0.1, z_loss=1e-3)

  def plain(h, w):
    return losses.cross_entropy(jnp.einsum("btd,dv->btv", h, w), targets, weights, **kw)

  def chunked(h, w):
    return losses.chunked_cross_entropy(h, lambda x: jnp.einsum("btd,dv->btv", x, w), targets,
                                        weights, chunk_tokens=chunk_tokens, **kw)

  want, got = jax.jit(plain)(hidden, w_out), jax.jit(chunked)(hidden, w_out)
  assert float(got[1]) > 0 and float(got[2]) == float(jnp.sum(weights))
  close(got, want)
  grad = lambda f: jax.jit(jax.grad(lambda h, w: f(h, w)[0], argnums=(0, 1)))(hidden, w_out)
  close(grad(chunked), grad(plain))


def test_chunked_loss_rejects_mismatched_shapes():
  with pytest.raises(ValueError, match="does not match targets"):
    losses.chunked_cross_entropy(jnp.zeros((2, 4, 3)), lambda x: x, jnp.zeros((2, 5), jnp.int32))


MODELS = {
    "decoder_only, tied": dict(arch="decoder_only", num_encoder_layers=0, norm_position="pre"),
    "encoder_decoder, untied, head transform and bias": dict(
        tie_embeddings=False, share_src_tgt_embeddings=False, head_transform=True,
        logits_bias=True),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_through_the_models_output_layer(name):
  """batch_hidden then vocab_projection in chunks: the loss and parameter gradients of
  batch_logits + cross_entropy."""
  sizes = dict(vocab_size=13, source_vocab_size=11, d_model=16, num_heads=2, mlp_dim=32,
               num_encoder_layers=1, num_decoder_layers=1, max_len=64)
  cfg = model_config(**(sizes | MODELS[name]))
  model = models.build_model(cfg)
  batch = {"targets": jnp.asarray(RNG.integers(1, 13, (2, 6)), jnp.int32)}
  if cfg.arch == "encoder_decoder":
    batch["inputs"] = jnp.asarray(RNG.integers(1, 11, (2, 5)), jnp.int32)
  params = jax.jit(lambda k: models.batch_init(model, {"params": k}, batch))(
      jax.random.key(0))["params"]
  weights = (batch["targets"] != 0).astype(jnp.float32)

  def plain(p):
    logits = models.batch_logits(model, p, batch)
    return losses.cross_entropy(logits, batch["targets"], weights, 0.1, 1e-3)[0]

  def chunked(p):
    hidden = models.batch_hidden(model, p, batch)
    return losses.chunked_cross_entropy(hidden, models.vocab_projection(model, p),
                                        batch["targets"], weights, 0.1, 1e-3, chunk_tokens=5)[0]

  want = jax.jit(jax.value_and_grad(plain))(params)
  got = jax.jit(jax.value_and_grad(chunked))(params)
  close(got, want)


@pytest.mark.slow  # two compiled train steps (~15 s of CPU); the loss itself is tested above
def test_train_step_with_chunked_loss_takes_the_plain_steps_update():
  """configs/g2p.py:tiny shrunk (encoder-decoder, label smoothing): one train step with
  train.loss_chunk_tokens=100 gives the plain step's loss and parameters; an encoder-only model
  with it is a one-line ConfigError."""
  cd = g2p.get_config("tiny")
  cd.model.update(vocab_size=13, source_vocab_size=11, dropout_rate=0.0, num_encoder_layers=1,
                  num_decoder_layers=1, d_model=16, num_heads=2, mlp_dim=32)
  batch = {"inputs": jnp.asarray(RNG.integers(1, 11, (4, 7)), jnp.int32),
           "targets": jnp.asarray(RNG.integers(1, 13, (4, 9)), jnp.int32)}
  results = []
  for chunk in (0, 100):
    cd.train.loss_chunk_tokens = chunk
    cfg = from_configdict(cd)
    model = models.build_model(cfg.model)
    tx = optim.make_optimizer(cfg.train, cfg.model.d_model)
    state = steps.create_train_state(cfg, model, jax.random.key(0), batch, tx)
    results.append(jax.jit(steps.make_train_step(cfg, model, tx))(state, batch))
  (plain, plain_metrics), (chunked, chunked_metrics) = results
  close(chunked_metrics["loss"], plain_metrics["loss"])
  close(chunked.params, plain.params)
  cd.model.update(arch="encoder_only", num_decoder_layers=0)
  cfg = from_configdict(cd)
  with pytest.raises(ConfigError, match="train.loss_chunk_tokens=100 needs"):
    steps.make_train_step(cfg, models.build_model(cfg.model), tx)
