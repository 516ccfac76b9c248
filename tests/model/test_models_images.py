"""The Vision Transformer path of the encoder-only model (model.image_size > 0): patch embedding
against a NumPy reshape and matmul, the 2-D sine-cosine table against big_vision's formula
written out in NumPy, the class-token and mean pooling against the encoder's own outputs, and
the configuration errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config import ConfigError, model_config
from transformer.model import models, positional, scoring, stacks

C = 14  # 4 special ids + 10 classes
BASE = dict(arch="encoder_only", head="classify", vocab_size=C, num_classes=C, d_model=32,
            num_heads=4, mlp_dim=64, num_encoder_layers=2, image_size=8, image_channels=3,
            patch_size=2, norm_position="pre", ffn="gelu", dropout_rate=0.0, head_bias=True)


@functools.cache
def _setup(**overrides):
  cfg = model_config(**(BASE | overrides))
  model = models.build_model(cfg)
  params = scoring.init_params(model, jax.random.key(0), models.example_batch(cfg))
  return cfg, model, params


def _images(n=2, seed=0):
  return np.random.default_rng(seed).normal(size=(n, 8, 8, 3)).astype(np.float32)


def _encoded(model, params, images):
  """The encoder's output [b, t, d] (after the final norm) for images."""
  return np.asarray(model.apply({"params": params}, jnp.asarray(images),
                                method=lambda m, x: m.encoder(None, images=x)))


@pytest.mark.parametrize("patch", [1, 2, 4, 8])
def test_patch_embedding_is_a_matmul_of_flattened_patches(patch):
  """Each patch [p, p, C], flattened, times the kernel plus the bias (NumPy loops over the grid)."""
  cfg, model, params = _setup(patch_size=patch, pooling="mean", positional="none")
  images = _images()
  out = np.asarray(model.apply({"params": params}, jnp.asarray(images),
                               method=lambda m, x: stacks.PatchEmbed(cfg).apply(
                                   {"params": params["encoder"]["patch_embed"]}, x)))
  kernel = np.asarray(params["encoder"]["patch_embed"]["projection"]["kernel"])
  bias = np.asarray(params["encoder"]["patch_embed"]["projection"]["bias"])
  side = 8 // patch
  want = np.zeros((2, side * side, 32), np.float32)
  for b in range(2):
    for i in range(side):
      for j in range(side):
        piece = images[b, i * patch:(i + 1) * patch, j * patch:(j + 1) * patch, :]
        want[b, i * side + j] = piece.reshape(-1) @ kernel + bias
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def _posemb_sincos_2d(h, w, width, temperature=10_000.0):
  """big_vision's posemb_sincos_2d (models/vit.py), written out with NumPy."""
  y, x = np.mgrid[:h, :w]
  omega = np.arange(width // 4) / (width // 4 - 1)
  omega = 1.0 / (temperature**omega)
  y = np.einsum("m,d->md", y.flatten(), omega)
  x = np.einsum("m,d->md", x.flatten(), omega)
  return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)


@pytest.mark.parametrize("h,w,d", [(4, 4, 32), (2, 3, 8), (7, 7, 64)])
def test_sincos_2d_table_is_big_visions(h, w, d):
  np.testing.assert_allclose(positional.sincos_2d_table(h, w, d), _posemb_sincos_2d(h, w, d),
                             rtol=1e-6, atol=1e-6)


def test_sincos_2d_entry_adds_the_grid_table_and_nothing_to_the_class_token():
  """With a class token the positional lookup is [0-row, grid rows]; the encoding is absolute."""
  cfg = model_config(**(BASE | dict(positional="sincos2d", pooling="class_token")))
  assert positional.encoding(cfg).kind == "absolute"
  rows = np.asarray(positional.ENCODINGS["sincos2d"](cfg, jnp.arange(17)[None]))[0]
  np.testing.assert_array_equal(rows[0], 0)
  np.testing.assert_allclose(rows[1:], _posemb_sincos_2d(4, 4, 32), atol=1e-6)


@pytest.mark.parametrize("pooling,length", [("class_token", 17), ("mean", 16)])
def test_shapes_and_pooling(pooling, length):
  """The sequence is the 16 patches (after the class token); the logits [b, 1, classes] are the
  classifier of the class token's output, or of the patches' mean."""
  _, model, params = _setup(pooling=pooling, positional="learned")
  images = _images()
  encoded = _encoded(model, params, images)
  assert encoded.shape == (2, length, 32)
  logits = np.asarray(models.batch_logits(model, params, {"images": jnp.asarray(images)}))
  assert logits.shape == (2, 1, C)
  pooled = encoded[:, 0] if pooling == "class_token" else encoded.mean(1)
  head = params["head"]["classifier"]
  want = pooled @ np.asarray(head["kernel"]) + np.asarray(head["bias"])
  np.testing.assert_allclose(logits[:, 0], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pooling", ["class_token", "mean"])
def test_without_positions_the_patch_order_does_not_matter(pooling):
  """positional='none': permuting the patches (swapping the image's 2x2 blocks) leaves the logits
  unchanged; a learned table sees the change."""
  images = _images()
  swapped = images.copy()
  swapped[:, :2, :2], swapped[:, 6:, 6:] = images[:, 6:, 6:], images[:, :2, :2]
  logits = {}
  for pos in ("none", "learned"):
    _, model, params = _setup(pooling=pooling, positional=pos)
    if pos == "learned":  # a table large enough to matter
      table = params["encoder"]["position_embed"]["embedding"]
      params = {**params, "encoder": {**params["encoder"], "position_embed": {
          "embedding": jax.random.normal(jax.random.key(1), table.shape)}}}
    logits[pos] = [np.asarray(models.batch_logits(model, params, {"images": jnp.asarray(x)}))
                   for x in (images, swapped)]
  np.testing.assert_allclose(*logits["none"], rtol=1e-4, atol=1e-5)
  assert np.abs(logits["learned"][0] - logits["learned"][1]).max() > 1e-3


@pytest.mark.parametrize("overrides,message", [
    (dict(patch_size=3), "model.patch_size=3 must divide model.image_size=8"),
    (dict(head="mlm"), "model.image_size=8 needs model.arch='encoder_only' with model.head="),
    (dict(positional="learned", pooling="class_token", max_len=16),
     "model.max_len=16 must be >= 17"),
    (dict(image_size=0, pooling="class_token"), "model.pooling='class_token' needs image inputs"),
    (dict(positional="sincos2d", d_model=30, num_heads=2), "model.d_model=30 must be a multiple"),
])
def test_bad_image_configs_are_one_line_errors(overrides, message):
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
    model_config(**(BASE | overrides))


def test_images_of_the_wrong_shape_are_refused():
  _, model, params = _setup(pooling="mean", positional="none")
  with pytest.raises(ValueError, match=r"images of shape \(8, 8, 1\)"):
    models.batch_logits(model, params, {"images": jnp.zeros((1, 8, 8, 1))})
