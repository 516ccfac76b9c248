"""Tests of transformer/model/moe.py (model.ffn=moe) against an explicit per-token NumPy loop over
experts: routing, capacity drops in position order, dropless grouped matmuls, shared experts, the
auxiliary losses; and the mixture inside the model: scan, remat, bf16, the decode cache and a
train step's losses and metrics."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from transformer import schema
from transformer.config import ConfigError, from_configdict, model_config
from transformer.model import layers, models, moe, scoring
from transformer.train import members, optim, steps

D, F, E, K = 8, 6, 4, 2
TOL = dict(rtol=2e-5, atol=2e-5)


def _cfg(**overrides):
  values = dict(d_model=D, mlp_dim=F, num_heads=2, ffn="moe", moe_num_experts=E, moe_top_k=K,
                moe_expert_ffn="swiglu", moe_capacity_factor=0.0)
  return model_config(**(values | overrides))


def _params(cfg, x, seed=0):
  """Unboxed parameters of a MoEFeedForward, router scaled up so that routing is decisive."""
  params = nn.meta.unbox(moe.MoEFeedForward(cfg).init(jax.random.key(seed), x)["params"])
  params["router"]["kernel"] = params["router"]["kernel"] * 3.0
  if cfg.use_bias:  # nonzero biases, so that a bias applied to the wrong expert shows
    params = jax.tree_util.tree_map_with_path(
        lambda p, v: v + 0.1 * jax.random.normal(jax.random.key(len(str(p))), v.shape)
        if p[-1].key == "bias" else v, params)
  return jax.tree.map(np.asarray, params)


def _act(name, z):
  return np.asarray(layers.FFNS[name].activation(jnp.asarray(z)))


def _reference(cfg, p, x):
  """(y [b, t, d], kept [b, t, k]) by a loop over rows, tokens and their choices: each expert
  fills its capacity in position order (token i's choices before token i+1's)."""
  b, t, _ = x.shape
  gated = layers.FFNS[cfg.moe_expert_ffn].gated
  slots = (math.ceil(cfg.moe_capacity_factor * t * cfg.moe_top_k / cfg.moe_num_experts)
           if cfg.moe_capacity_factor > 0 else None)
  bias = lambda name, e: p[name]["bias"][e] if cfg.use_bias else 0.0
  y = np.zeros(x.shape, np.float64)
  kept = np.zeros((b, t, cfg.moe_top_k), bool)
  for row in range(b):
    used = np.zeros(cfg.moe_num_experts, int)
    for i in range(t):
      logits = x[row, i].astype(np.float64) @ p["router"]["kernel"]
      probs = np.exp(logits - logits.max())
      probs /= probs.sum()
      chosen = np.argsort(-probs, kind="stable")[:cfg.moe_top_k]
      gates = probs[chosen] / (probs[chosen].sum() if cfg.moe_renormalize else 1.0)
      for j, (e, g) in enumerate(zip(chosen, gates)):
        used[e] += 1
        if slots is not None and used[e] > slots:
          continue  # over capacity: this expert adds nothing
        kept[row, i, j] = True
        v = x[row, i]
        if gated:
          h = (_act(cfg.moe_expert_ffn, v @ p["wi_gate"]["kernel"][e] + bias("wi_gate", e))
               * (v @ p["wi_up"]["kernel"][e] + bias("wi_up", e)))
        else:
          h = _act(cfg.moe_expert_ffn, v @ p["wi"]["kernel"][e] + bias("wi", e))
        y[row, i] += g * (h @ p["wo"]["kernel"][e] + bias("wo", e))
  return y, kept


def _x(b=3, t=7, seed=1):
  return np.asarray(jax.random.normal(jax.random.key(seed), (b, t, D)))


def _apply(cfg, p, x):
  y, state = moe.MoEFeedForward(cfg).apply({"params": p}, jnp.asarray(x), mutable=[moe.COLLECTION])
  return np.asarray(y), moe.aux_metrics(state[moe.COLLECTION], cfg.moe_num_experts)


@pytest.mark.parametrize("expert_ffn,use_bias,renormalize", [
    ("swiglu", False, True), ("gelu", True, True), ("relu", False, False)])
def test_dropless_equals_a_per_token_loop(expert_ffn, use_bias, renormalize):
  cfg = _cfg(moe_expert_ffn=expert_ffn, use_bias=use_bias, moe_renormalize=renormalize)
  x = _x()
  p = _params(cfg, x)
  y, aux = _apply(cfg, p, x)
  want, _ = _reference(cfg, p, x)
  np.testing.assert_allclose(y, want, **TOL)
  assert float(aux["dropped"]) == 0.0


def test_capacity_drops_the_later_tokens_of_a_full_expert():
  cfg = _cfg(moe_capacity_factor=0.5)  # C = ceil(0.5 * 7 * 2 / 4) = 2 slots per expert per row
  x = _x()
  p = _params(cfg, x)
  y, aux = _apply(cfg, p, x)
  want, kept = _reference(cfg, p, x)
  assert 0 < (~kept).sum() < kept.size  # some pairs dropped, not all
  np.testing.assert_allclose(y, want, **TOL)
  np.testing.assert_allclose(float(aux["dropped"]), 1.0 - kept.mean(), rtol=1e-6)
  # A token whose every choice is dropped outputs exactly 0 (the residual carries it alone).
  gone = ~kept.any(-1)
  if gone.any():
    assert np.all(y[gone] == 0.0)


def test_a_token_with_every_choice_dropped_outputs_zero():
  """At C = ceil(0.25 * 7 * 2 / 4) = 1 slot per expert per row, at most 4 of a row's 14 pairs are
  kept, so some tokens lose both choices: their output is exactly 0, the rest the reference's."""
  cfg = _cfg(moe_capacity_factor=0.25)
  x = _x()
  p = _params(cfg, x)
  y, _ = _apply(cfg, p, x)
  want, kept = _reference(cfg, p, x)
  gone = ~kept.any(-1)
  assert gone.any()
  assert np.all(np.asarray(y)[gone] == 0.0)
  np.testing.assert_allclose(y, want, **TOL)


def test_capacity_with_room_for_all_equals_dropless():
  x = _x()
  cfg = _cfg(moe_capacity_factor=float(E))  # C = t * k: every pair fits
  p = _params(cfg, x)
  np.testing.assert_allclose(_apply(cfg, p, x)[0],
                             _apply(dataclasses.replace(cfg, moe_capacity_factor=0.0), p, x)[0],
                             **TOL)


def test_a_token_is_dropped_by_earlier_tokens_only():
  """Position order is causal: changing later tokens never changes an earlier token's output."""
  cfg = _cfg(moe_capacity_factor=0.5)
  x = _x()
  p = _params(cfg, x)
  changed = x.copy()
  changed[:, 4:] = _x(seed=7)[:, 4:]
  np.testing.assert_allclose(_apply(cfg, p, x)[0][:, :4], _apply(cfg, p, changed)[0][:, :4],
                             **TOL)


def test_shared_experts_add_a_dense_ffn_of_their_width():
  cfg = _cfg(moe_num_shared_experts=2)
  x = _x()
  p = _params(cfg, x)
  assert p["shared"]["wi_gate"]["kernel"].shape == (D, 2 * F)
  routed, _ = _reference(cfg, p, x)
  s = p["shared"]
  shared = (_act("swiglu", x @ s["wi_gate"]["kernel"] + s["wi_gate"]["bias"])
            * (x @ s["wi_up"]["kernel"] + s["wi_up"]["bias"])) @ s["wo"]["kernel"] + s["wo"]["bias"]
  np.testing.assert_allclose(_apply(cfg, p, x)[0], routed + shared, **TOL)


def test_aux_losses_equal_the_formulas():
  cfg = _cfg()
  x = _x()
  p = _params(cfg, x)
  _, aux = _apply(cfg, p, x)
  logits = x.reshape(-1, D).astype(np.float64) @ p["router"]["kernel"]
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  top = np.argsort(-probs, axis=-1, kind="stable")[:, :K]
  load = np.bincount(top.ravel(), minlength=E) / top.size  # fraction of the assignments
  balance = E * np.sum(load * probs.mean(0))  # Switch Transformer, eq. 4 (k assignments a token)
  z = np.mean(np.log(np.exp(logits).sum(-1)) ** 2)  # ST-MoE's router z-loss
  np.testing.assert_allclose(np.asarray(aux["load"]), load, rtol=1e-6)
  np.testing.assert_allclose(float(aux["balance_loss"]), balance, rtol=1e-5)
  np.testing.assert_allclose(float(aux["z_loss"]), z, rtol=1e-5)


def test_balanced_router_gives_balance_loss_one():
  """A zero router: every probability 1/E, top-k by index; the loss is E * sum load/E = 1."""
  logits = jnp.zeros((4, 5, E))
  probs, _, experts = moe.route(logits, K, True)
  assert float(moe.aux_losses(logits, probs, experts)["balance_loss"]) == pytest.approx(1.0)


def test_expert_variants_are_the_dense_feedforwards():
  """model.moe_expert_ffn's choices are layers.FFNS; model.ffn's are those and 'moe'."""
  assert schema.KEYS["model.moe_expert_ffn"].choices() == tuple(layers.FFNS)
  assert set(schema.KEYS["model.ffn"].choices()) == {"moe", *layers.FFNS}


def test_top_k_above_the_experts_is_a_config_error():
  with pytest.raises(ConfigError, match="model.moe_top_k=5 must be <= model.moe_num_experts=4"):
    _cfg(moe_top_k=5)


# ---- inside the model


def _lm(**overrides):
  values = dict(arch="decoder_only", vocab_size=13, d_model=D, num_heads=2, mlp_dim=F,
                num_encoder_layers=0, num_decoder_layers=2, max_len=64, ffn="moe",
                moe_num_experts=E, moe_top_k=K, moe_capacity_factor=0.0, norm_position="pre",
                positional="rope", dropout_rate=0.0)
  return model_config(**(values | overrides))


def _tokens(b=2, t=9):
  return np.asarray(jax.random.randint(jax.random.key(3), (b, t), 1, 13), np.int32)


def _lm_params(cfg, tokens):
  init = jax.jit(lambda: models.build_model(cfg).init(jax.random.key(0), tokens)["params"])
  return nn.meta.unbox(init())


def test_scan_and_remat_equal_the_unrolled_stack():
  cfg, tokens = _lm(), _tokens()
  params = _lm_params(cfg, tokens)
  apply = lambda c, p: jax.jit(lambda p: models.build_model(c).apply(
      {"params": p}, tokens, mutable=["moe"]))(p)  # compiled: eager flax runs op by op
  logits, sown = apply(cfg, params)
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs),
                         *[params["decoder"][f"layers_{i}"] for i in range(2)])
  scan_params = {**{k: v for k, v in params["decoder"].items() if not k.startswith("layers_")},
                 "layers": stacked}
  for remat in ("none", "full"):
    scan = dataclasses.replace(cfg, scan_layers=True, remat=remat)
    got, got_sown = apply(scan, {**params, "decoder": scan_params})
    np.testing.assert_allclose(got, logits, **TOL)
    want_aux, got_aux = (moe.aux_metrics(s["moe"], E) for s in (sown, got_sown))
    for name in moe.AUX_NAMES:
      np.testing.assert_allclose(got_aux[name], want_aux[name], rtol=1e-5)


def test_bfloat16_stays_close_to_float32():
  cfg, tokens = _lm(moe_capacity_factor=1.25), _tokens()
  params = _lm_params(cfg, tokens)
  apply = lambda c: jax.jit(lambda p: models.build_model(c).apply({"params": p}, tokens))(params)
  want, got = apply(cfg), apply(dataclasses.replace(cfg, dtype="bfloat16"))
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, atol=0.1)


@pytest.mark.parametrize("capacity_factor", [0.0, 2.0])
def test_cached_decode_equals_the_full_forward(capacity_factor):
  """Token by token through the decode cache gives the teacher-forced logits: dropless, and with
  a capacity that drops nothing (factor E / k: C = t slots per expert; decode's C = 1)."""
  cfg = _lm(moe_capacity_factor=capacity_factor)
  tokens = _tokens()
  params = _lm_params(cfg, tokens)
  model = models.build_model(cfg)
  inputs = models.shift_right(jnp.asarray(tokens))
  full = jax.jit(lambda p: model.apply({"params": p}, inputs, method=model.decode))(params)
  cache = jax.jit(lambda: model.init(jax.random.key(0), inputs, method=model.decode,
                                     decode=True)["cache"])()
  decode = jax.jit(lambda p, c, x: model.apply({"params": p, "cache": c}, x, method=model.decode,
                                               decode=True, mutable=["cache"]))
  for i in range(tokens.shape[1]):
    step, state = decode(params, cache, inputs[:, i:i + 1])
    cache = state["cache"]
    np.testing.assert_allclose(step[:, 0], full[:, i], **TOL)


def _train_cfg(**train):
  cd = base.get_config()
  cd.model.update(arch="decoder_only", d_model=D, num_heads=2, mlp_dim=F, num_encoder_layers=0,
                  num_decoder_layers=2, vocab_size=13, dropout_rate=0.0, max_len=16, ffn="moe",
                  moe_num_experts=E, moe_top_k=K, moe_capacity_factor=0.5)
  cd.data.update(max_target_len=16, max_source_len=16)
  cd.train.update(optimizer="sgd", momentum=0.0, schedule="constant", warmup_steps=0,
                  learning_rate=0.1, label_smoothing=0.0, moe_balance_loss=0.5, moe_z_loss=0.25)
  cd.train.update(**train)
  return from_configdict(cd)


def test_train_step_adds_the_weighted_aux_losses_and_logs_them():
  cfg = _train_cfg()
  tokens = _tokens(b=4, t=8)
  batch = dict(targets=tokens)
  model = models.build_model(cfg.model)
  tx = optim.make_optimizer(cfg.train, cfg.model.d_model)
  state = steps.create_train_state(cfg, model, jax.random.key(0), batch, tx=tx)
  _, metrics = jax.jit(steps.make_train_step(cfg, model, tx))(state, batch)
  logits, sown = jax.jit(lambda p: models.batch_logits(model, p, batch, mutable=["moe"]))(
      state.params)
  aux = moe.aux_metrics(sown["moe"], E)
  logp = jax.nn.log_softmax(logits)
  ce = -np.mean(np.take_along_axis(np.asarray(logp), tokens[..., None], -1))
  np.testing.assert_allclose(metrics["loss"], ce, rtol=1e-5)  # the cross-entropy alone
  np.testing.assert_allclose(metrics["moe_aux_loss"],
                             0.5 * aux["balance_loss"] + 0.25 * aux["z_loss"], rtol=1e-5)
  np.testing.assert_allclose(metrics["moe_dropped"], aux["dropped"], rtol=1e-5)
  assert float(metrics["moe_dropped"]) > 0
  load = np.asarray([metrics[f"moe_load_{e}"] for e in range(E)])
  np.testing.assert_allclose(load, aux["load"], rtol=1e-5)
  np.testing.assert_allclose(load.sum(), 1.0, rtol=1e-6)
  # The gradient is that of cross-entropy + the weighted auxiliary losses.
  def objective(params):
    logits, sown = models.batch_logits(model, params, batch, mutable=["moe"])
    a = moe.aux_metrics(sown["moe"], E)
    logp = jax.nn.log_softmax(logits)
    return (-jnp.mean(jnp.take_along_axis(logp, jnp.asarray(tokens)[..., None], -1))
            + 0.5 * a["balance_loss"] + 0.25 * a["z_loss"])
  grads = jax.jit(jax.grad(objective))(state.params)
  norm = np.sqrt(sum(np.sum(np.square(np.asarray(g))) for g in jax.tree.leaves(grads)))
  np.testing.assert_allclose(metrics["grad_norm"], norm, rtol=1e-4)


def test_grad_accumulation_averages_the_aux_losses_like_the_loss():
  """Two micro-batches of equal token weight: each metric is the mean of the halves' values."""
  tokens = _tokens(b=4, t=8)
  cfg = _train_cfg(grad_accum_steps=2)
  model = models.build_model(cfg.model)
  tx = optim.make_optimizer(cfg.train, cfg.model.d_model)
  state = steps.create_train_state(cfg, model, jax.random.key(0), dict(targets=tokens), tx=tx)
  _, metrics = jax.jit(steps.make_train_step(cfg, model, tx))(state, dict(targets=tokens))
  # One compiled forward pass for both halves (op by op, each of its operations compiles alone).
  sown = jax.jit(lambda p, t: models.batch_logits(model, p, dict(targets=t), mutable=["moe"])[1])
  halves = [moe.aux_metrics(sown(state.params, half)["moe"], E)
            for half in (tokens[:2], tokens[2:])]
  for name, key in (("balance_loss", "moe_balance_loss"), ("z_loss", "moe_z_loss"),
                    ("dropped", "moe_dropped")):
    np.testing.assert_allclose(metrics[key], np.mean([h[name] for h in halves]), rtol=1e-5)
  np.testing.assert_allclose(metrics["moe_load_1"], np.mean([h["load"][1] for h in halves]),
                             rtol=1e-5)


def test_moe_with_scheduled_sampling_is_a_config_error():
  cd = base.get_config()
  cd.model.update(ffn="moe", vocab_size=13, source_vocab_size=13)
  cd.train.scheduled_sampling.update(schedule="linear")
  cfg = from_configdict(cd)
  with pytest.raises(ConfigError, match="model.ffn='moe' needs train.scheduled_sampling"):
    steps.make_train_step(cfg, models.build_model(cfg.model),
                          optim.make_optimizer(cfg.train, 512))


def test_members_equal_their_separate_steps():
  """train.members: two MoE members (learning rates traced) in one vmapped step each equal their
  own train step, auxiliary metrics included."""
  configs = [_train_cfg(learning_rate=lr) for lr in (0.1, 0.3)]
  batch = dict(targets=_tokens(b=4, t=8))
  build = lambda c: (models.build_model(c.model), optim.make_optimizer(c.train, D))
  states, separate = [], []
  for seed, cfg in enumerate(configs):
    model, tx = build(cfg)
    state = steps.create_train_state(cfg, model, jax.random.key(seed), batch, tx=tx)
    states.append(state)
    separate.append(jax.jit(steps.make_train_step(cfg, model, tx))(state, batch))
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
  model, tx = build(configs[0])
  step = members.make_train_step(configs, steps.make_train_step(configs[0], model, tx))
  new, metrics = jax.jit(step)(stacked, batch)
  for i, (state, m) in enumerate(separate):
    for key in ("loss", "moe_aux_loss", "moe_dropped", "moe_load_3", "grad_norm"):
      np.testing.assert_allclose(metrics[key][i], m[key], rtol=1e-5, err_msg=key)
    for got, want in zip(jax.tree.leaves(new.params), jax.tree.leaves(state.params)):
      np.testing.assert_allclose(got[i], want, atol=1e-6)  # every parameter, router and experts


# default coverage: the train step's aux losses (test_train_step_adds_the_weighted_aux_losses...)
@pytest.mark.slow
def test_evaluation_reports_the_aux_losses_token_averaged():
  """The eval step's moe sums, over two batches, give the weight-averaged per-batch values."""
  cfg = _train_cfg()
  model = models.build_model(cfg.model)
  batches = [dict(targets=_tokens(b=4, t=8)), dict(targets=_tokens(b=4, t=8)[:, :6])]
  params = steps.create_train_state(cfg, model, jax.random.key(0), batches[0]).params
  step = jax.jit(scoring.make_eval_step(model))
  totals = {}
  for batch in batches:
    for k, v in step(params, batch).items():
      totals[k] = totals.get(k, 0.0) + np.asarray(v, np.float64)
  got = scoring.teacher_forced_metrics(totals, prefix="eval/")
  values = [moe.aux_metrics(models.batch_logits(model, params, b, mutable=["moe"])[1]["moe"], E)
            for b in batches]
  weights = [b["targets"].size for b in batches]
  for name in ("balance_loss", "z_loss", "dropped"):
    want = np.average([v[name] for v in values], weights=weights)
    np.testing.assert_allclose(got[f"eval/moe_{name}"], want, rtol=1e-5)
