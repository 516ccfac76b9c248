"""The models' batch-level entry point: example_batch(cfg) -> batch_init / batch_logits."""

import jax
import numpy as np
import pytest

from transformer.config import model_config
from transformer.model import models


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only"])
def test_example_batch_inits_and_batch_logits_match_the_models_call(arch):
  """example_batch has the features the architecture reads; batch_logits of a padded batch
  without segment ids equals the model's own call with default_segment_ids given explicitly."""
  cfg = model_config(arch=arch, d_model=16, num_heads=2, mlp_dim=32, num_encoder_layers=1,
                     num_decoder_layers=1, vocab_size=11, source_vocab_size=11, max_len=64)
  model = models.build_model(cfg)
  example = models.example_batch(cfg, length=5)
  assert set(example) == ({"inputs", "targets"} if arch == "encoder_decoder" else {"targets"})
  params = models.batch_init(model, {"params": jax.random.key(0)}, example)["params"]
  assert models.batch_logits(model, params, example).shape == (1, 5, 11)
  tokens = np.array([[3, 4, 5, 0, 0], [6, 7, 0, 0, 0]], np.int32)
  batch = {name: tokens for name in example}
  explicit = {f"{name}_segment_ids": models.default_segment_ids(tokens) for name in example}
  np.testing.assert_array_equal(models.default_segment_ids(tokens),
                                [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
  np.testing.assert_allclose(models.batch_logits(model, params, batch),
                             model.apply({"params": params}, **{
                                 k: v for k, v in (batch | explicit).items()}), atol=1e-6)
