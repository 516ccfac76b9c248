"""µP (transformer/model/parametrization.py): each parameter's init std and Adam learning-rate
factor against the table written out here, the attention and readout multipliers against NumPy,
µP at its base width equal to the standard model, and the fold into a standard model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config import ConfigError, from_configdict, model_config
from transformer.model import models, parametrization, scoring
from transformer.schema import get_config
from transformer.train import optim

V = 40
SMALL = dict(arch="decoder_only", num_encoder_layers=0, num_decoder_layers=2, vocab_size=V,
             num_heads=4, max_len=64, positional="learned", norm_position="pre", ffn="gelu",
             use_bias=False, scale_embeddings=False, dropout_rate=0.0)


def _setup(width, base=0, **overrides):
  mup = dict(parametrization="mup", mup_base_width=base) if base else {}
  cfg = model_config(**(SMALL | dict(d_model=width, mlp_dim=4 * width) | mup | overrides))
  model = models.build_model(cfg)
  params = scoring.init_params(model, jax.random.key(0), models.example_batch(cfg))
  return cfg, model, params


def _flat(tree):
  return {"/".join(str(k.key) for k in path if hasattr(k, "key")): np.asarray(x)
          for path, x in jax.tree_util.tree_leaves_with_path(tree)}


def _expected(name: str, shape, width: int, base: int):
  """(init std or None for constants, Adam lr factor) of a parameter: the docs' table by hand."""
  m = width / base
  if name.endswith("token_embed/embedding"):
    return base**-0.5, 1.0
  if name.endswith("position_embed/embedding"):
    return 0.02, 1.0
  if name.endswith("logits_dense/kernel"):
    return np.sqrt(m) / np.sqrt(shape[0]), 1.0
  if name.endswith("/kernel"):  # hidden: lecun over the fan-in (out's fan-in is heads x head_dim)
    fan_in = shape[0] * (shape[1] if name.endswith("out/kernel") else 1)
    return 1.0 / np.sqrt(fan_in), 1.0 / m
  return None, 1.0  # norm scales and biases


@pytest.mark.parametrize("tied", [True, False])
def test_init_std_and_learning_rate_factors_follow_the_table(tied):
  """A d_model 128 model on base width 32 (m = 4): every parameter's sample std and its actual
  first Adam update (|lr * factor| for a sign-only step) match the table."""
  width, base, lr = 128, 32, 1e-2
  cfg, _, params = _setup(width, base, tie_embeddings=tied)
  tc = from_configdict(get_config()).train
  tc = dataclasses.replace(tc, optimizer="adam", learning_rate=lr, schedule="constant",
                           warmup_steps=0, grad_clip=0.0, weight_decay=0.0)
  tx = optim.make_optimizer(tc, cfg)
  grads = jax.tree.map(jnp.ones_like, params)
  updates, _ = tx.update(grads, tx.init(params), params)
  flat_params, flat_updates = _flat(params), _flat(updates)
  assert any(n.endswith("logits_dense/kernel") for n in flat_params) != tied
  for name, value in flat_params.items():
    std, factor = _expected(name, value.shape, width, base)
    if std is not None:
      np.testing.assert_allclose(value.std(), std, rtol=0.1, err_msg=name)
    np.testing.assert_allclose(np.abs(flat_updates[name]), lr * factor, rtol=1e-4, err_msg=name)


def test_mup_at_its_base_width_is_the_standard_model():
  """parametrization=mup with d_model == mup_base_width: the same parameters, logits and Adam
  updates as the standard parametrization, bit for bit."""
  cfg_sp, model_sp, params_sp = _setup(64)
  cfg_mu, model_mu, params_mu = _setup(64, base=64)
  for a, b in zip(jax.tree.leaves(params_sp), jax.tree.leaves(params_mu)):
    np.testing.assert_array_equal(a, b)
  tokens = np.arange(1, 17, dtype=np.int32)[None] % V
  np.testing.assert_array_equal(model_sp.apply({"params": params_sp}, tokens),
                                model_mu.apply({"params": params_mu}, tokens))
  tc = from_configdict(get_config()).train
  grads = jax.tree.map(lambda p: jnp.sin(jnp.arange(p.size, dtype=p.dtype)).reshape(p.shape),
                       params_sp)
  for cfg, params in ((cfg_sp, params_sp), (cfg_mu, params_mu)):
    tx = optim.make_optimizer(tc, cfg)
    state = tx.init(params)
    for _ in range(2):
      updates, state = tx.update(grads, state, params)
    if cfg is cfg_sp:
      want = updates
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(updates)):
    np.testing.assert_array_equal(a, b)


def test_attention_and_readout_multipliers_against_numpy():
  """Under µP (d_model 64, base 16, 4 heads: head_dim 16, base head_dim 4) the attention weights
  are softmax(q.k * 2 / 16) of the captured q, k, and the tied logits are hidden . E^T / 4."""
  cfg, model, params = _setup(64, base=16)
  assert parametrization.attention_scale(cfg) == pytest.approx(2 / 16)
  tokens = (np.arange(12, dtype=np.int32)[None] * 7) % (V - 1) + 1
  logits, state = model.apply({"params": params}, tokens, capture_intermediates=True,
                              mutable=["intermediates"])
  inter = state["intermediates"]["decoder"]["layers_0"]["self_attention"]
  qkv = np.asarray(inter["qkv"]["__call__"][0], np.float64)  # [b, t, 3, n, h]
  scores = np.einsum("btnh,bsnh->bnts", qkv[:, :, 0], qkv[:, :, 1]) * 2 / 16
  scores = np.where(np.tril(np.ones((12, 12), bool)), scores, -np.inf)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  np.testing.assert_allclose(inter["attention_weights"][0], weights, atol=1e-5)
  hid = model.clone(hidden_only=True).apply({"params": params}, tokens)
  table = np.asarray(params["token_embed"]["embedding"], np.float64)
  want = np.einsum("btd,vd->btv", np.asarray(hid, np.float64), table) / 4
  np.testing.assert_allclose(logits, want, atol=1e-5)


def test_untied_mup_folds_into_a_standard_model():
  """to_standard of an untied µP model (scaled embeddings, width 4x its base) gives a standard
  config and weights whose logits equal the µP model's."""
  cfg, model, params = _setup(64, base=16, tie_embeddings=False, scale_embeddings=True)
  params = jax.tree.map(lambda p: p + 0.05 * jax.random.normal(jax.random.key(3), p.shape),
                        params)  # off the init: every kernel matters
  standard, folded = parametrization.to_standard(cfg, params)
  assert standard.parametrization == "standard" and standard.mup_base_width == 0
  tokens = (np.arange(16, dtype=np.int32)[None] * 5) % (V - 1) + 1
  np.testing.assert_allclose(models.build_model(standard).apply({"params": folded}, tokens),
                             model.apply({"params": params}, tokens), atol=2e-5, rtol=1e-5)


def test_tied_mup_off_its_base_refuses_to_fold():
  """A tied µP model wider than its base cannot become a standard one: a one-line ConfigError."""
  cfg, _, params = _setup(64, base=16)
  with pytest.raises(ConfigError, match="tie_embeddings=True at d_model=64 != "
                     "model.mup_base_width=16") as e:
    parametrization.to_standard(cfg, params)
  assert "\n" not in str(e.value)


def test_config_errors_and_undeclared_roles():
  """mup without a base width is a ConfigError; a kernel of a module the table lacks is named."""
  with pytest.raises(ConfigError, match="mup_base_width > 0"):
    model_config(**(SMALL | dict(d_model=32, mlp_dim=64, parametrization="mup")))
  with pytest.raises(ValueError, match="decoder/mystery/kernel: its µP role"):
    parametrization.role(["decoder", "mystery", "kernel"])
  assert parametrization.role(["decoder", "layers", "ffn", "wi_gate", "kernel"]) == "hidden"
  assert parametrization.role(["decoder", "layers", "ffn", "router", "kernel"]) == "readout"


def test_resuming_with_another_parametrization_is_refused(tmp_path):
  """model.parametrization and model.mup_base_width are FIXED: a workdir trained under one is
  not resumed under another (a one-line CheckpointError naming the key)."""
  import json  # pylint: disable=g-import-not-at-top
  from transformer.config import to_dict  # pylint: disable=g-import-not-at-top
  from transformer.run import checkpoints  # pylint: disable=g-import-not-at-top
  cd = get_config()
  cd.model.update(parametrization="mup", mup_base_width=128)
  (tmp_path / "config.json").write_text(json.dumps(to_dict(from_configdict(cd))))
  for key, value in (("parametrization", "standard"), ("mup_base_width", 64)):
    other = get_config()
    other.model.update(parametrization="mup", mup_base_width=128)
    other.model.update(**{key: value})
    with pytest.raises(checkpoints.CheckpointError, match=f"model.{key}="):
      checkpoints.check_compatible(str(tmp_path), from_configdict(other))


@pytest.mark.parametrize("overrides", [
    dict(arch="encoder_decoder", num_encoder_layers=1, source_vocab_size=V, num_kv_heads=2,
         scan_layers=True, positional="relative", tie_embeddings=False, use_bias=True),
    dict(ffn="moe", moe_num_experts=4, moe_top_k=2, moe_expert_ffn="swiglu",
         moe_num_shared_experts=1),
    dict(arch="encoder_only", num_encoder_layers=1, num_decoder_layers=0, head="mlm",
         head_transform=True, logits_bias=True, positional="rope"),
    dict(arch="encoder_only", num_encoder_layers=1, num_decoder_layers=0, head="classify",
         num_classes=3, image_size=8, patch_size=4, pooling="class_token", head_bias=True),
], ids=["encdec_gqa_scan", "moe", "mlm_head", "vit"])
def test_every_parameter_of_every_architecture_has_a_role(overrides):
  """Encoder-decoder (GQA, scanned layers, relative bias), MoE (experts hidden, router a
  readout), masked-LM heads and ViT: every parameter gets a role; the expected ones by name."""
  cfg = model_config(**(SMALL | dict(d_model=32, mlp_dim=64, parametrization="mup",
                                     mup_base_width=8) | overrides))
  shapes = jax.eval_shape(lambda: scoring.init_params(
      models.build_model(cfg), jax.random.key(0), models.example_batch(cfg)))
  roles = {name: parametrization.role(name.split("/")) for name in _flat(shapes)}
  hidden = [n for n, r in roles.items() if r == "hidden"]
  assert hidden and all(n.split("/")[-2] in parametrization.HIDDEN_MODULES for n in hidden)
  if "moe_num_experts" in overrides:
    assert roles["decoder/layers_0/ffn/router/kernel"] == "readout"
    assert roles["decoder/layers_0/ffn/wi_gate/kernel"] == "hidden"
  if "image_size" in overrides:
    assert roles["encoder/patch_embed/projection/kernel"] == "embedding"
    assert roles["head/classifier/kernel"] == "readout"
