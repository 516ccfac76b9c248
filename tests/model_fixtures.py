"""Shared fixtures of the model tests (tests/model/test_models_*.py): tiny configs, cached params.

Tiny models (d_model 32, 4 heads sharing 2 kv heads (GQA), 2 layers, vocab 13) run eagerly, and
every test uses the same few array shapes (batch 8, lengths 8, 4 and 1) so that XLA compiles each
operation once per process. Positional tables (relative, learned) are re-initialised large so that
a wrong position would visibly change the numbers.
"""

import dataclasses
import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.config import model_config
from transformer.model.models import build_model
from transformer.model.positional import ENCODINGS


V, SV = 13, 11  # target and source vocabulary sizes
ARCHS = ["encoder_decoder", "decoder_only"]
POSITIONALS = list(ENCODINGS)  # every encoding of the table
TOL = dict(rtol=2e-5, atol=2e-5)
B = 8  # batch size of every call


def _cfg(**overrides):
  base = dict(vocab_size=V, source_vocab_size=SV, d_model=32, num_heads=4, num_kv_heads=2, mlp_dim=64,
              num_encoder_layers=2, num_decoder_layers=2, max_len=64)
  base.update(overrides)
  return model_config(**base)


@functools.cache
def _init(cfg):
  """(model, unboxed params) for a config; position tables scaled up to stddev ~1. A scanned
  config gets the unrolled config's params, stacked (see test_scan_and_remat_...)."""
  model = build_model(cfg)
  if cfg.scan_layers:
    return model, _stack_layers(_init(dataclasses.replace(cfg, scan_layers=False))[1])
  x = jnp.ones((B, 4), jnp.int32)
  args = (x, x) if cfg.arch == "encoder_decoder" else (x,)
  params = nn.meta.unbox(model.init(jax.random.key(0), *args)["params"])
  def scale(path, leaf):
    names = {getattr(k, "key", None) for k in path}
    return leaf * 50.0 if names & {"relative_bias", "position_embed"} else leaf
  return model, jax.tree_util.tree_map_with_path(scale, params)


def _forward(cfg, params, inputs, targets, **kw):
  model = build_model(cfg)
  if cfg.arch == "encoder_decoder":
    return model.apply({"params": params}, jnp.asarray(inputs), jnp.asarray(targets), **kw)
  kw = {k: v for k, v in kw.items() if not k.startswith("inputs_")}
  return model.apply({"params": params}, jnp.asarray(targets), **kw)


def _tile(row):
  return np.tile(np.asarray(row)[None], (B, 1))


def _perturb(tokens, rng, vocab):
  """Changes every token to a different nonzero token."""
  return 1 + (tokens - 1 + rng.integers(1, vocab - 1, size=tokens.shape)) % (vocab - 1)


def _stack_layers(tree):
  """Unrolled params (layers_0, layers_1, ...) -> the scanned layout ('layers', stacked on axis 0)."""
  if not isinstance(tree, dict):
    return tree
  names = sorted((k for k in tree if re.fullmatch(r"layers_\d+", k)), key=lambda k: int(k[7:]))
  out = {k: _stack_layers(v) for k, v in tree.items() if k not in names}
  if names:
    out["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *[tree[k] for k in names])
  return out


def _unstack_layers(tree):
  """The inverse of _stack_layers."""
  if not isinstance(tree, dict):
    return tree
  out = {k: _unstack_layers(v) for k, v in tree.items() if k != "layers"}
  if "layers" in tree:
    n = jax.tree.leaves(tree["layers"])[0].shape[0]
    out.update({f"layers_{i}": jax.tree.map(lambda x, i=i: x[i], tree["layers"])
                for i in range(n)})
  return out
