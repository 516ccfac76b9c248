"""Tests of configs/*.py: every variant validates; the ablation partners and nanoGPT settings hold."""

import importlib

import jax
import numpy as np
import pytest

from transformer.config import ConfigError, from_configdict
from transformer.models import build_model

ALL = ["g2p:tiny", "g2p:small", "g2p:base", "g2p_decoder_only:tiny", "g2p_decoder_only:small",
       "g2p_decoder_only:base", "lm:char", "lm:nanogpt_cpu", "lm:bpe", "wmt14_ende:", "lm1b:"]


def load(name):
  module, _, arg = name.partition(":")
  return importlib.import_module(f"configs.{module}").get_config(arg)


@pytest.mark.parametrize("name", ALL)
def test_every_config_validates(name):
  """Each config file and variant passes transformer.config validation (no typo'd keys)."""
  from_configdict(load(name))


def test_unknown_variant_is_a_clear_error():
  """An unknown variant names itself and the valid ones."""
  with pytest.raises(ValueError, match="unknown variant 'huge'.*tiny, small, base"):
    load("g2p:huge")


def num_params(cfg, vocab=43, source_vocab=31):
  import dataclasses  # pylint: disable=g-import-not-at-top
  m = dataclasses.replace(cfg.model, vocab_size=vocab, source_vocab_size=source_vocab)
  model = build_model(m)
  ids = np.ones((1, 8), np.int32)
  args = (ids,) if m.arch == "decoder_only" else (ids, ids)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *args))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


@pytest.mark.parametrize("variant", ["tiny", "small", "base"])
def test_decoder_only_g2p_matches_encoder_decoder_parameters(variant):
  """g2p_decoder_only has the same parameter count as g2p (embeddings, norms and biases
  included) to within 1%, so the ablation compares architectures, not sizes."""
  enc_dec = num_params(from_configdict(load(f"g2p:{variant}")))
  dec = from_configdict(load(f"g2p_decoder_only:{variant}"))
  # The prefix-LM's one table covers both vocabularies, as training sizes it.
  dec_only = num_params(dec, vocab=43, source_vocab=0)
  assert abs(dec_only - enc_dec) / enc_dec < 0.01, (dec_only, enc_dec)


def test_nanogpt_cpu_settings():
  """lm.py:nanogpt_cpu carries nanoGPT's CPU command's settings: 4 layers, 4 heads, d 128,
  block 64, batch 12, 2000 steps, lr 1e-3, dropout 0."""
  c = from_configdict(load("lm:nanogpt_cpu"))
  got = (c.model.num_decoder_layers, c.model.num_heads, c.model.d_model, c.data.max_target_len,
         c.data.batch_size, c.train.num_steps, c.train.learning_rate, c.model.dropout_rate)
  assert got == (4, 4, 128, 64, 12, 2000, 1e-3, 0.0)


def test_paper_base_recipe_in_wmt14():
  """wmt14_ende.py is the base model of Vaswani et al.: 6+6, 512, 8 heads, 2048, dropout 0.1,
  label smoothing 0.1, Adam 0.9/0.98/1e-9, rsqrt with 4000 warmup, shared ~37k BPE."""
  c = from_configdict(load("wmt14_ende:"))
  m, t = c.model, c.train
  assert (m.num_encoder_layers, m.num_decoder_layers, m.d_model, m.num_heads, m.mlp_dim) == (
      6, 6, 512, 8, 2048)
  assert (m.dropout_rate, t.label_smoothing, t.optimizer, t.b1, t.b2, t.eps) == (
      0.1, 0.1, "adam", 0.9, 0.98, 1e-9)
  assert (t.schedule, t.warmup_steps, c.data.spm_vocab_size, c.data.source_tokenizer) == (
      "rsqrt", 4000, 37000, "")


def test_config_error_type_is_value_error():
  """ConfigError is a ValueError (callers may catch either)."""
  assert issubclass(ConfigError, ValueError)
