"""Tiny random models and the references of the generate() tests (tests/infer/test_decoding.py,
tests/model/test_ensemble.py, tests/model/test_models_prefix_lm.py): decoding settings, random
parameters filled by NumPy, and the log-probs of one uncached teacher-forced forward pass."""

import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np

from transformer.config import DecodeConfig, model_config
from transformer.data import pipeline
from transformer.model.models import build_model


def _decode_cfg(method="greedy", beam_size=1, length_penalty=0.0, **kw):
  return DecodeConfig(method=method, beam_size=beam_size, length_penalty=length_penalty,
                      temperature=kw.get("temperature", 1.0), top_k=kw.get("top_k", 0),
                      top_p=kw.get("top_p", 1.0), max_decode_len=0)


def random_params(model, init_args, seed=0):
  """Random parameters of the model's shapes, filled by NumPy: compiling model.init (threefry
  initialisers) takes ~20 s on a 2-core CPU, longer than everything else here."""
  shapes = flax.core.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), *init_args)["params"])
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    name = getattr(path[-1], "key", "")
    if name == "scale":
      return jnp.asarray(1.0 + 0.1 * rng.standard_normal(leaf.shape), leaf.dtype)
    std = 1.0 / np.sqrt(leaf.shape[0]) if leaf.ndim >= 2 else 0.1
    return jnp.asarray(std * rng.standard_normal(leaf.shape), leaf.dtype)
  return jax.tree_util.tree_map_with_path(fill, shapes)


def _tiny_model(arch, **overrides):
  """A tiny random model and params; the prompts/inputs have different lengths (padding matters)."""
  cfg = model_config(arch=arch, vocab_size=13, source_vocab_size=11, d_model=16, num_heads=2,
                     mlp_dim=32, num_encoder_layers=1, num_decoder_layers=2, dropout_rate=0.0,
                     max_len=64, **overrides)
  model = build_model(cfg)
  src = np.array([[3, 4, 5, 6, 2], [7, 8, 2, 0, 0], [9, 2, 0, 0, 0]], np.int32)
  init_args = (src, src) if arch == "encoder_decoder" else (src,)
  params = random_params(model, init_args)
  return model, params, src


@functools.lru_cache(maxsize=None)
def _jit_apply(model):
  """model.apply compiled once per model (a fresh jax.jit(model.apply) would recompile)."""
  return jax.jit(model.apply)


def _full_forward_log_probs(model, params, src, gen, prefix_lm):
  """Log-probs [b, t, v] of every generated position from ONE uncached teacher-forced forward pass
  of the training path (model.__call__), aligned so that [:, j] predicts gen[:, j]; since the pass is
  causal this equals a separate full forward pass per step. Decoder-only rows prompt + gen are
  assembled by the training pipeline, so the prefix is the pipeline's, not this test's own."""
  if model.config.arch == "encoder_decoder":
    logits = _jit_apply(model)({"params": params}, src, jnp.asarray(gen))
    return np.asarray(jax.nn.log_softmax(logits)), np.zeros(len(src), int)
  lengths = (src != 0).sum(1)
  examples = pipeline.prefix_lm_examples([s[:n] for s, n in zip(src, lengths)], gen)
  batch = pipeline.one_per_row(examples, np.arange(len(src)),
                               {"targets": int(examples.lengths["targets"].max())}, len(src))
  logits = _jit_apply(model)({"params": params}, batch["targets"],
                             targets_positions=batch["targets_positions"],
                             targets_segment_ids=batch["targets_segment_ids"],
                             prefix_mask=batch["prefix_mask"] if prefix_lm else None)
  log_probs = np.asarray(jax.nn.log_softmax(logits))
  return np.stack([log_probs[r, n:n + gen.shape[1]] for r, n in enumerate(lengths)]), lengths


def _length(row, eos):
  row = list(row)
  return row.index(eos) + 1 if eos in row else len(row)
