"""Tests of transformer/train/steps.py: the train and eval steps, scheduled sampling, teacher-forced
metrics, keys and parameter dtypes."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base, lm
from transformer.config import from_configdict
from transformer.model import models, scoring
from transformer.model.losses import cross_entropy
from transformer.model.models import build_model
from transformer.train import optim, scheduled_sampling, steps

VOCAB = 13


def tiny_config(arch="encoder_decoder", **train):
  """A validated Config of a 1+1-layer d=16 model with a plain SGD step (update = -lr * grad)."""
  cd = base.get_config()
  cd.model.update(arch=arch, d_model=16, num_heads=2, mlp_dim=32, num_encoder_layers=1,
                  num_decoder_layers=1, vocab_size=VOCAB, source_vocab_size=VOCAB,
                  dropout_rate=0.0, max_len=32)
  cd.data.update(max_source_len=16, max_target_len=16)
  cd.train.update(optimizer="sgd", momentum=0.0, schedule="constant", warmup_steps=0,
                  learning_rate=1.0, label_smoothing=0.1)
  cd.train.update(**train)
  return from_configdict(cd)


def make_batch(seed=0, b=4, s=7, t=6, packed=False):
  """A random batch with ragged padding (so micro-batches carry different token counts)."""
  rng = np.random.RandomState(seed)
  inputs = rng.randint(1, VOCAB, (b, s)).astype(np.int32)
  targets = rng.randint(1, VOCAB, (b, t)).astype(np.int32)
  for i in range(b):  # row i keeps i+2 target tokens and i+3 source tokens (capped)
    targets[i, min(t, i + 2):] = 0
    inputs[i, min(s, i + 3):] = 0
  batch = dict(inputs=inputs, targets=targets, weights=(targets != 0).astype(np.float32))
  if packed:  # two segments per row: positions restart, segment ids 1 and 2
    half = t // 2
    seg = np.where(np.arange(t) < half, 1, 2)[None].repeat(b, 0).astype(np.int32)
    pos = np.where(np.arange(t) < half, np.arange(t), np.arange(t) - half)[None].repeat(b, 0)
    batch.update(targets=rng.randint(1, VOCAB, (b, t)).astype(np.int32),
                 targets_segment_ids=seg, targets_positions=pos.astype(np.int32),
                 weights=np.ones((b, t), np.float32))
    batch["inputs_segment_ids"] = seg[:, :1].repeat(s, 1)
    batch["inputs_positions"] = np.arange(s, dtype=np.int32)[None].repeat(b, 0)
    batch["inputs"] = rng.randint(1, VOCAB, (b, s)).astype(np.int32)
  return batch


def one_step(cfg, batch, seed=0, state=None):
  model = build_model(cfg.model)
  tx = optim.make_optimizer(cfg.train, cfg.model.d_model)
  if state is None:
    state = steps.create_train_state(cfg, model, jax.random.PRNGKey(seed), batch, tx=tx)
  new_state, metrics = jax.jit(steps.make_train_step(cfg, model, tx))(state, batch)
  return state, new_state, jax.device_get(metrics)


def test_grad_accumulation_equals_large_batch():
  """4 micro-batches with different padding give the same SGD update (hence the same mean
  gradient over all tokens) and the same loss as one step on the whole batch, to ~1e-6."""
  batch = make_batch(b=8)
  state, big, m_big = one_step(tiny_config(grad_accum_steps=1), batch)
  _, acc, m_acc = one_step(tiny_config(grad_accum_steps=4), batch, state=state)
  np.testing.assert_allclose(m_acc["loss"], m_big["loss"], rtol=1e-6)
  assert m_acc["weight_sum"] == m_big["weight_sum"] == batch["weights"].sum()
  for a, b in zip(jax.tree.leaves(acc.params), jax.tree.leaves(big.params)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-6)


def test_train_step_loss_matches_reference_cross_entropy():
  """The step's reported loss is the label-smoothed cross-entropy sum over weighted tokens divided
  by the weight sum, computed by applying the model and loss directly; the step counter advances.
  (The batch is test_grad_accumulation_equals_large_batch's: the same programs, compiled once.)"""
  cfg = tiny_config()
  batch = make_batch(b=8)
  state, new_state, metrics = one_step(cfg, batch)
  model = build_model(cfg.model)
  # Compiled whole: op by op, the forward pass compiles each of its operations on its own.
  logits = jax.jit(model.apply)({"params": state.params}, batch["inputs"], batch["targets"])
  loss_sum, _, w = cross_entropy(logits, batch["targets"], batch["weights"], label_smoothing=0.1)
  np.testing.assert_allclose(metrics["loss"], loss_sum / w, rtol=1e-6)
  assert int(new_state.step) == 1 and metrics["finite"]


@pytest.mark.parametrize("schedule,k,c,floor,closed_form", [
    ("linear", 1.0, 0.01, 0.2, lambda i: max(0.2, 1.0 - 0.01 * i)),
    ("exponential", 0.99, 0.0, 0.1, lambda i: max(0.1, 0.99**i)),
    ("inverse_sigmoid", 20.0, 0.0, 0.0, lambda i: 20.0 / (20.0 + math.exp(i / 20.0))),
    ("none", 1.0, 0.0, 0.0, lambda i: 1.0),
])
def test_teacher_forcing_schedules_match_closed_forms(schedule, k, c, floor, closed_form):
  """Each schedule equals its closed form (Mihaylova & Martins 2019) at steps 0..300."""
  ss = tiny_config(scheduled_sampling=dict(schedule=schedule, k=k, c=c,
                                           min_teacher_forcing=floor)).train.scheduled_sampling
  for i in (0, 1, 10, 55, 100, 300):
    np.testing.assert_allclose(scheduled_sampling.teacher_forcing_prob(ss, i), closed_form(i), rtol=1e-5)


@pytest.mark.parametrize("arch,packed", [("encoder_decoder", False), ("encoder_decoder", True),
                                         ("decoder_only", True)])
def test_two_pass_with_full_teacher_forcing_equals_one_pass(arch, packed):
  """With teacher forcing 1.0 the second pass sees the gold inputs, so its logits equal the
  ordinary teacher-forced forward pass (also for packed rows and a prefix-LM)."""
  cfg = tiny_config(arch)
  batch = make_batch(packed=packed)
  if arch == "decoder_only":
    batch["prefix_mask"] = (np.arange(6) % 3 < 1).astype(np.int32)[None].repeat(4, 0)
  model = build_model(cfg.model)
  params = scoring.init_params(model, jax.random.PRNGKey(0), batch)
  one = models.batch_logits(model, params, batch)
  two = scheduled_sampling.two_pass_logits(model, arch, params, batch, jnp.float32(1.0),
                                           jax.random.PRNGKey(1), deterministic=True)
  np.testing.assert_allclose(two, one, atol=1e-5)


def test_scheduled_sampling_replaces_inputs_when_teacher_forcing_is_zero():
  """With teacher forcing 0 the second pass differs from the one-pass logits (inputs are the
  model's own predictions), and the train step reports the schedule's probability."""
  cfg = tiny_config(scheduled_sampling=dict(schedule="linear", k=0.0, c=0.0,
                                            min_teacher_forcing=0.0))
  batch = make_batch()
  model = build_model(cfg.model)
  params = scoring.init_params(model, jax.random.PRNGKey(0), batch)
  one = models.batch_logits(model, params, batch)
  two = scheduled_sampling.two_pass_logits(model, cfg.model.arch, params, batch,
                                           jnp.float32(0.0), jax.random.PRNGKey(1), deterministic=True)
  assert np.abs(np.asarray(two - one)).max() > 1e-4
  _, _, metrics = one_step(cfg, batch)
  assert metrics["teacher_forcing"] == 0.0 and metrics["finite"]


def test_train_steps_reduce_loss():
  """Thirty Adam steps on one fixed batch lower the loss by more than half (the step learns)."""
  cfg = tiny_config(optimizer="adam", learning_rate=3e-2)
  batch = make_batch()
  model = build_model(cfg.model)
  tx = optim.make_optimizer(cfg.train, cfg.model.d_model)
  state = steps.create_train_state(cfg, model, jax.random.PRNGKey(0), batch, tx=tx)
  step = jax.jit(steps.make_train_step(cfg, model, tx))
  losses = []
  for _ in range(30):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  assert losses[-1] < 0.5 * losses[0], losses


def test_eval_step_reference():
  """eval_step's sums give the unsmoothed mean NLL, the token accuracy and exp(loss), checked
  against a NumPy log-softmax of the same logits."""
  cfg = tiny_config()
  batch = make_batch()
  model = build_model(cfg.model)
  params = scoring.init_params(model, jax.random.PRNGKey(0), batch)
  sums = jax.device_get(scoring.make_eval_step(model)(params, batch))
  out = scoring.teacher_forced_metrics(sums, prefix="eval/")
  logits = np.asarray(jax.jit(model.apply)({"params": params}, batch["inputs"], batch["targets"]),
                      np.float64)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  w = batch["weights"]
  nll = -np.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]
  np.testing.assert_allclose(out["eval/loss"], (nll * w).sum() / w.sum(), rtol=1e-5)
  acc = ((logits.argmax(-1) == batch["targets"]) * w).sum() / w.sum()
  np.testing.assert_allclose(out["eval/accuracy"], acc, rtol=1e-6)
  np.testing.assert_allclose(out["eval/perplexity"], math.exp(out["eval/loss"]), rtol=1e-6)

def test_perplexity_is_exp_of_the_split_token_average_not_a_mean_of_batch_perplexities():
  """Two batches, one scored token of NLL 2.0 and three of NLL 1.0 in all: the loss is
  5/4 nats per token and the perplexity exp(1.25) = 3.4903 (a mean of the per-batch perplexities,
  (e^2 + e^1) / 2 = 5.0537, would weigh the one-token batch like the three-token one); a diverged
  model's perplexity is inf rather than a capped number."""
  batches = [dict(loss_sum=2.0, weight_sum=1.0, correct_sum=1.0),
             dict(loss_sum=3.0, weight_sum=3.0, correct_sum=1.0)]
  totals = {k: sum(b[k] for b in batches) for k in batches[0]}
  out = scoring.teacher_forced_metrics(totals, prefix="eval/")
  assert out["eval/loss"] == pytest.approx(1.25)
  assert out["eval/perplexity"] == pytest.approx(3.490343, rel=1e-6)
  assert out["eval/accuracy"] == pytest.approx(0.5) and out["eval/scored_tokens"] == 4.0
  diverged = scoring.teacher_forced_metrics(dict(loss_sum=1e4, weight_sum=2.0, correct_sum=0.0))
  assert diverged["perplexity"] == math.inf and diverged["loss"] == 5e3


def test_create_train_state_takes_typed_and_legacy_keys_alike():
  """create_train_state from jax.random.key(s) and from jax.random.PRNGKey(s) gives bitwise the
  same parameters and stores the same uint32 key data (the slow test below covers the steps)."""
  cfg = tiny_config()
  model, batch = build_model(cfg.model), make_batch()
  tx = optim.make_optimizer(cfg.train, cfg.model.d_model)
  typed = steps.create_train_state(cfg, model, jax.random.key(2), batch, tx=tx)
  legacy = steps.create_train_state(cfg, model, jax.random.PRNGKey(2), batch, tx=tx)
  np.testing.assert_array_equal(typed.rng, legacy.rng)
  for a, b in zip(jax.tree.leaves(typed.params), jax.tree.leaves(legacy.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow  # ~70 s of compiles; the fast test above checks create_train_state
def test_functions_taking_a_key_accept_typed_and_legacy_keys():
  """Every public function that takes a key gives bitwise the same result for a typed key
  (jax.random.key(s), what JAX recommends) and a legacy uint32 key (jax.random.PRNGKey(s)): both
  hold the same threefry bits. Checked: create_train_state (which hands a key derived from its own
  to init_params, and stores the raw uint32 key data), train_step(rng=) with dropout,
  scheduled_sampling.two_pass_logits and evaluation.decode_batches with sampling (which hands the
  key to decoding.generate)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from transformer.infer import evaluation  # pylint: disable=g-import-not-at-top
  cfg = tiny_config()
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dropout_rate=0.3))
  model, batch = build_model(cfg.model), make_batch()
  tx = optim.make_optimizer(cfg.train, cfg.model.d_model)
  step = jax.jit(steps.make_train_step(cfg, model, tx))
  sample = dataclasses.replace(cfg.eval.decode, method="sample", temperature=2.0)
  two_pass = jax.jit(lambda p, b, tf, key: scheduled_sampling.two_pass_logits(
      model, cfg.model.arch, p, b, tf, key, False))

  def outputs(make_key):
    state = steps.create_train_state(cfg, model, make_key(2), batch, tx=tx)
    params = state.params
    stepped, metrics = step(state, batch, make_key(3))
    logits = two_pass(params, batch, jnp.float32(0.5), make_key(4))
    decoded, _ = evaluation.decode_batches(cfg, model, params, [[5, 6, 1], [7, 1]], sample,
                                           eos_id=1, batch_size=2, rng=make_key(5))
    return dict(state=state, stepped=stepped.params, loss=metrics["loss"],
                logits=logits, decoded=np.asarray(decoded, object))

  typed, legacy = outputs(jax.random.key), outputs(jax.random.PRNGKey)
  assert typed["state"].rng.dtype == jnp.uint32
  np.testing.assert_array_equal(typed["state"].rng, jax.random.key_data(jax.random.key(2)))
  for name in typed:
    for a, b in zip(jax.tree.leaves(typed[name]), jax.tree.leaves(legacy[name])):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


def test_bfloat16_parameters_keep_their_dtypes_through_steps():
  """model.param_dtype=bfloat16: a train step returns the state in the dtypes it took (bfloat16
  parameters and moments), so the compiled step runs again on its own output."""
  cd = lm.get_config("nanogpt_cpu")
  cd.model.update(num_decoder_layers=1, d_model=16, num_heads=2, mlp_dim=32, vocab_size=17,
                  max_len=64, param_dtype="bfloat16", dtype="bfloat16")
  cfg = from_configdict(cd)
  model = models.build_model(cfg.model)
  tx = optim.make_optimizer(cfg.train, cfg.model.d_model)
  batch = {"targets": jnp.asarray(np.random.default_rng(0).integers(1, 17, (2, 8)), jnp.int32)}
  state = steps.create_train_state(cfg, model, jax.random.key(0), batch, tx)
  dtypes = jax.tree.map(lambda x: x.dtype, state)
  assert jax.tree.leaves(state.params)[0].dtype == jnp.bfloat16
  step = jax.jit(steps.make_train_step(cfg, model, tx)).lower(state, batch).compile()
  for _ in range(2):  # a compiled step rejects a state of other dtypes
    state, metrics = step(state, batch)
  assert jax.tree.map(lambda x: x.dtype, state) == dtypes
  assert np.isfinite(float(metrics["loss"]))
