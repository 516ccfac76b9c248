"""The compiled training steps: TrainState, its creation, train_step and K steps in one scan.

The step's key is `fold_in(state.rng, state.step)`, so a resumed run draws the same numbers as an
uninterrupted one. Losses stay sums over tokens until the end of the step, so gradient
accumulation and data parallelism give exactly the large batch's mean.
"""
import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from transformer import choices
from transformer.config import Config, ConfigError, excluded_ids
from transformer.model import layers, models, moe, scoring
from transformer.model.losses import chunked_cross_entropy, cross_entropy
from transformer.train import optim
from transformer.train.hyper import Hyper
from transformer.train.scheduled_sampling import teacher_forcing_prob, two_pass_logits

Array = jax.Array
PyTree = Any


@dataclasses.dataclass(frozen=True)
class TrainState:
  """Everything a step updates; plain arrays only, so it checkpoints and shards cleanly. A None
  `ema_params` is no node of the pytree: an EMA-off state checkpoints as if it had no such field."""
  step: Array  # int32 []: updates applied so far
  params: PyTree
  opt_state: PyTree
  rng: Array  # uint32 [2]: the run's key data (checkpoints hold no typed keys); see key_data
  ema_params: PyTree = None  # float32, shaped (and sharded) like params; None = no EMA

  def replace(self, **changes: Any) -> "TrainState":
    return dataclasses.replace(self, **changes)


def _state_fields(state: TrainState) -> tuple[str, ...]:
  ema = ("ema_params",) if state.ema_params is not None else ()
  return ("step", "params", "opt_state", "rng") + ema


jax.tree_util.register_pytree_with_keys(
    TrainState,
    lambda s: ([(jax.tree_util.GetAttrKey(n), getattr(s, n)) for n in _state_fields(s)], None),
    lambda _, children: TrainState(*children),
    flatten_func=lambda s: ([getattr(s, n) for n in _state_fields(s)], None))


def key_data(key: Array) -> Array:
  """The raw uint32 data of a typed (jax.random.key) or legacy (jax.random.PRNGKey) key."""
  typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
  return jax.random.key_data(key) if typed else jnp.asarray(key, jnp.uint32)


def moe_sums(cfg: Config, sown: PyTree, weight_sum: Array) -> dict[str, Array]:
  """A forward pass's sown 'moe' collection -> sums times the micro-batch's weight sum (so that
  accumulation and data parallelism average them as they do the loss): moe_aux_loss (the
  weighted balance and z losses the training loss adds), each of them, the dropped fraction and
  each expert's load moe_load_<e>."""
  aux, tc = moe.aux_metrics(sown, cfg.model.moe_num_experts), cfg.train
  values = dict(moe_aux_loss=tc.moe_balance_loss * aux["balance_loss"]
                + tc.moe_z_loss * aux["z_loss"],
                moe_balance_loss=aux["balance_loss"], moe_z_loss=aux["z_loss"],
                moe_dropped=aux["dropped"])
  values |= {f"moe_load_{e}": aux["load"][e] for e in range(cfg.model.moe_num_experts)}
  return {k: v * weight_sum for k, v in values.items()}


def _make_loss_sums(cfg: Config, model: nn.Module, h: Hyper) -> Callable:
  """Returns `loss_sums(params, micro) -> (loss_sum, (weight_sum, extras))` of one micro-batch:
  `micro` holds its batch, dropout key and teacher-forcing probability; `extras` holds a mixture
  of experts' `moe_sums` (the loss sum includes its moe_aux_loss), else nothing. `h`'s traced
  label_smoothing, z_loss and dropout rates replace the config's."""
  arch, tc = cfg.model.arch, cfg.train
  use_ss = tc.scheduled_sampling.schedule != "none"
  mixture = choices.FFNS[cfg.model.ffn].mixture
  if mixture and use_ss:
    raise ConfigError("model.ffn='moe' needs train.scheduled_sampling.schedule='none' (its "
                      "auxiliary losses come from one teacher-forced pass)")
  mutable = [moe.COLLECTION] if mixture else False
  rates = ("dropout_rate", "attention_dropout_rate", "ffn_dropout_rate")
  deterministic = all(layers.is_off(h.get(r, cfg.model)) for r in rates)  # a traced rate is on
  if tc.loss_chunk_tokens and (arch == "encoder_only" or use_ss):
    raise ConfigError(f"train.loss_chunk_tokens={tc.loss_chunk_tokens} needs model.arch="
                      "encoder_decoder|decoder_only and no train.scheduled_sampling")

  vocab_head = arch != "encoder_only" or cfg.model.head == "mlm"
  excluded = excluded_ids(cfg.model) if vocab_head else ()  # no smoothing mass goes there

  def loss_sums(params, micro):
    batch, key, tf_prob = micro["batch"], micro["rng"], micro["tf_prob"]
    weights, rngs = scoring.target_weights(batch), {"dropout": key}
    kw = dict(label_smoothing=h.get("label_smoothing", tc), z_loss=h.get("z_loss", tc),
              excluded=excluded)
    sown = None
    if tc.loss_chunk_tokens:  # the output layer and the loss a chunk of tokens at a time
      hidden = models.batch_hidden(model, params, batch, deterministic=deterministic, rngs=rngs,
                                   mutable=mutable)
      if mixture:
        hidden, sown = hidden[0], hidden[1][moe.COLLECTION]
      loss_sum, _, weight_sum = chunked_cross_entropy(
          hidden, models.vocab_projection(model, params), batch["targets"], weights,
          chunk_tokens=tc.loss_chunk_tokens, **kw)
    else:
      if use_ss:
        logits = two_pass_logits(model, arch, params, batch, tf_prob, key, deterministic)
      else:
        logits = models.batch_logits(model, params, batch, deterministic=deterministic, rngs=rngs,
                                     mutable=mutable)
        if mixture:
          logits, sown = logits[0], logits[1][moe.COLLECTION]
      loss_sum, _, weight_sum = cross_entropy(logits, batch["targets"], weights, **kw)
    if not mixture:
      return loss_sum, (weight_sum, {})
    extras = moe_sums(cfg, sown, weight_sum)
    return loss_sum + extras["moe_aux_loss"], (weight_sum, extras)

  return loss_sums


def _step_parts(cfg: Config, model: nn.Module, tx: optax.GradientTransformation | None,
                h: Hyper) -> tuple[Callable, optax.GradientTransformation, optax.Schedule]:
  """(loss sums, optimizer, schedule) a step trains with: `model` and `tx` for a plain run; with
  traced values `h`, the optimizer (and, for a traced dropout rate, the model) built from them."""
  if h.traced:
    model_cfg = h.model_config(cfg.model)
    model = model if model_cfg is None else models.build_model(model_cfg)
    tx = optim.make_optimizer(cfg.train, cfg.model, h)
  return _make_loss_sums(cfg, model, h), tx, optim.make_schedule(cfg.train, cfg.model, h)


def make_train_step(cfg: Config, model: nn.Module, tx: optax.GradientTransformation) -> Callable:
  """Returns `train_step(state, batch, rng=None, axis_name=None, hyper=Hyper()) -> (state,
  metrics)`: `rng` overrides state.rng; the sums are `psum`med over pmap's `axis_name` before
  normalising; `hyper`'s traced values (members.py) replace cfg's, the optimizer (and, for a
  dropout rate, the model) then built from them in place of `tx` and `model`. Metrics stay on
  device: loss, weight_sum, grad_norm, learning_rate, teacher_forcing, finite."""
  tc = cfg.train
  plain = _step_parts(cfg, model, tx, Hyper())  # a config error here, not at the first trace

  def train_step(state: TrainState, batch: dict[str, Any], rng: Array | None = None,
                 axis_name: str | None = None, hyper: Hyper = Hyper()):
    loss_sums, step_tx, lr_fn = _step_parts(cfg, model, tx, hyper) if hyper.traced else plain
    grad_fn = jax.value_and_grad(loss_sums, has_aux=True)
    key = jax.random.fold_in(state.rng if rng is None else rng, state.step)
    if axis_name is not None:  # a different dropout mask on every device
      key = jax.random.fold_in(key, jax.lax.axis_index(axis_name))
    tf_prob = teacher_forcing_prob(tc.scheduled_sampling, state.step)
    batch = {k: v for k, v in batch.items() if v is not None}
    n = tc.grad_accum_steps
    micro = dict(batch=optim.split_micro_batches(batch, n), rng=jax.random.split(key, n),
                 tf_prob=jnp.broadcast_to(tf_prob, (n,)))
    if n == 1:
      (loss_sum, (weight_sum, extras)), grads = grad_fn(state.params,
                                                        jax.tree.map(lambda x: x[0], micro))
    else:
      loss_sum, (weight_sum, extras), grads = optim.accumulate_gradients(grad_fn, state.params,
                                                                         micro)
    if axis_name is not None:
      loss_sum, weight_sum, extras, grads = jax.lax.psum((loss_sum, weight_sum, extras, grads),
                                                         axis_name)
    denom = jnp.maximum(weight_sum, 1.0)
    grads = jax.tree.map(lambda g: g / denom, grads)
    updates, opt_state = step_tx.update(grads, state.opt_state, state.params)
    # The state keeps its dtypes (bfloat16 parameters: bfloat16 moments), so every step takes the
    # state the previous one gave (for float32 parameters the casts are no-ops).
    opt_state = jax.tree.map(lambda new, old: new.astype(old.dtype), opt_state, state.opt_state)
    params = optax.apply_updates(state.params, updates)
    if extras:  # the logged loss is the cross-entropy alone; the auxiliary losses apart
      loss_sum = loss_sum - extras["moe_aux_loss"]
    loss, grad_norm = loss_sum / denom, optax.tree.norm(grads)
    metrics = dict(loss=loss, weight_sum=weight_sum, grad_norm=grad_norm,
                   learning_rate=lr_fn(state.step), teacher_forcing=tf_prob,
                   finite=jnp.isfinite(loss) & jnp.isfinite(grad_norm))
    metrics |= {k: v / denom for k, v in extras.items()}
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    if tc.ema_decay:  # after the update, on every device alike (pmap: replicated params)
      new_state = new_state.replace(ema_params=optim.update_ema(
          state.ema_params, params, tc.ema_decay, new_state.step))
    return new_state, metrics

  return train_step


def scan_steps(train_step: Callable) -> Callable:
  """`train_step` over the leading axis of `batches` in one `lax.scan`, exactly as K steps."""

  def multi_step(state: TrainState, batches: dict[str, Any], rng: Array | None = None,
                 axis_name: str | None = None):
    return jax.lax.scan(lambda s, b: train_step(s, b, rng, axis_name), state, batches)

  return multi_step


def eval_params(state: TrainState) -> PyTree:
  """The parameters evaluations use: the EMA (in the parameters' dtypes) if any, else params."""
  if state.ema_params is None:
    return state.params
  return jax.tree.map(lambda e, p: e.astype(p.dtype), state.ema_params, state.params)


def create_train_state(cfg: Config, model: nn.Module, rng: Array, example_batch: dict[str, Any],
                       tx: optax.GradientTransformation | None = None,
                       unbox: bool = True) -> TrainState:
  """A fresh TrainState at step 0 with the run key `rng` and, with train.ema_decay, an EMA equal to
  the params. unbox=False keeps flax's logical-axis boxes (for deriving shardings)."""
  tx = tx or optim.make_optimizer(cfg.train, cfg.model)
  batch = {k: jnp.asarray(v) for k, v in example_batch.items() if v is not None}

  @jax.jit  # one compiled call instead of seconds of op-by-op dispatch
  def create(key, batch):
    params = scoring.init_params(model, jax.random.fold_in(key, 1), batch, unbox)
    ema = jax.tree.map(lambda p: p.astype(jnp.float32), params) if cfg.train.ema_decay else None
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=key_data(key), ema_params=ema)

  return create(rng, batch)
