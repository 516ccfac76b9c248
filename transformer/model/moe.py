"""A mixture-of-experts feed-forward (model.ffn=moe): top-k token-choice routing over
model.moe_num_experts experts, each a dense FFN variant (model.moe_expert_ffn) of hidden size
mlp_dim, plus optional always-on shared experts.

Routing (float32): softmax over all experts' router logits, the top-k experts, their probabilities
renormalised to sum to 1 (model.moe_renormalize; Mixtral's, and the same as a softmax over the
selected logits). With model.moe_capacity_factor > 0, each expert takes at most
C = ceil(factor * t * k / E) of a row's t tokens; slots go in position order (token i's choices,
then token i+1's), so a token's fate depends on its row's earlier tokens only (causal), and a
token over capacity gets 0 from that expert (passes through the residual). With factor 0 the
(token, choice) pairs of the whole batch are sorted by expert and run as grouped matmuls
(`jax.lax.ragged_dot`): nothing is dropped.

Parameters follow Mixtral's layout: router/kernel [d, E]; wi_gate/kernel, wi_up/kernel [E, d, f]
(its w1, w3), wo/kernel [E, f, d] (its w2); non-gated experts have wi/kernel. Each layer sows its
auxiliary quantities into the 'moe' collection (`aux_metrics` reads them): Switch Transformer's
load-balancing loss, ST-MoE's router z-loss, the per-expert load and the dropped fraction.
"""

import dataclasses
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from transformer.config import ModelConfig
from transformer.model import layers, parametrization
from transformer.model.kernels import PLAIN, Kernels

Array = jax.Array

COLLECTION = "moe"  # the variable collection each MoE layer sows its auxiliary quantities into
AUX_NAMES = ("balance_loss", "z_loss", "load", "dropped")


class StackedDense(nn.Module):
  """E kernels [E, in, out] (and biases [E, out]) with logical axes ('expert', in, out)."""
  config: ModelConfig
  num_experts: int
  features_in: int
  features: int
  axes: tuple[str, str]

  @nn.compact
  def __call__(self) -> tuple[Array, Array | None]:
    """(kernel [E, in, out], bias [E, out] or None) in the compute dtype."""
    cfg, dtype = self.config, jnp.dtype(self.config.dtype)
    init = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
    kernel = self.param("kernel", nn.with_logical_partitioning(init, ("expert", *self.axes)),
                        (self.num_experts, self.features_in, self.features),
                        jnp.dtype(cfg.param_dtype))
    bias = None
    if cfg.use_bias:
      bias = self.param("bias", nn.with_logical_partitioning(
          nn.initializers.zeros_init(), ("expert", self.axes[1])),
                        (self.num_experts, self.features), jnp.dtype(cfg.param_dtype))
      bias = jnp.asarray(bias, dtype)
    return jnp.asarray(kernel, dtype), bias


def capacity(config: ModelConfig, tokens: int) -> int:
  """Slots per expert for a row of `tokens` tokens: ceil(factor * tokens * top_k / experts)."""
  m = config
  return max(1, math.ceil(m.moe_capacity_factor * tokens * m.moe_top_k / m.moe_num_experts))


def route(logits: Array, top_k: int, renormalize: bool) -> tuple[Array, Array, Array]:
  """float32 router logits [..., E] -> (probs [..., E], gates [..., k], experts [..., k] int)."""
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  gates, experts = jax.lax.top_k(probs, top_k)
  if renormalize:
    gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
  return probs, gates, experts


def aux_losses(logits: Array, probs: Array, experts: Array) -> dict[str, Array]:
  """Switch's balance loss E * sum_e load_e * mean prob_e (load_e: the fraction of the k * tokens
  assignments that go to e, before any drop), ST-MoE's z-loss mean logsumexp^2, and the load [E]."""
  num_experts = probs.shape[-1]
  counts = jnp.sum(jax.nn.one_hot(experts, num_experts, dtype=jnp.float32),
                   axis=tuple(range(experts.ndim)))
  load = counts / experts.size
  importance = jnp.mean(probs.reshape(-1, num_experts), axis=0)
  z = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
  return dict(balance_loss=num_experts * jnp.sum(load * importance),
              z_loss=jnp.mean(jnp.square(z)), load=load)


class MoEFeedForward(nn.Module):
  """The mixture-of-experts feed-forward: x [b, t, d] -> [b, t, d] (see the module doc)."""
  config: ModelConfig
  kernels: Kernels = PLAIN  # the shared experts' (layers.FeedForward)

  @nn.compact
  def __call__(self, x: Array, deterministic: bool = True) -> Array:
    cfg = self.config
    num_experts, k = cfg.moe_num_experts, cfg.moe_top_k
    router = nn.Dense(num_experts, use_bias=False, dtype=jnp.float32,
                      param_dtype=jnp.dtype(cfg.param_dtype), name="router",
                      kernel_init=nn.with_logical_partitioning(layers.scaled_lecun_normal(
                          parametrization.readout_init_scale(cfg)), ("embed", None)))
    x32 = x.astype(jnp.float32)
    multiplier = parametrization.readout_multiplier(cfg)  # a readout: µP's 1/m
    logits = router(x32 if multiplier == 1.0 else x32 * multiplier)  # [b, t, E]
    probs, gates, experts = route(logits, k, cfg.moe_renormalize)
    aux = aux_losses(logits, probs, experts)
    ffn = layers.dense_ffn(cfg)
    stacked = lambda name, d_in, d_out, axes: StackedDense(cfg, num_experts, d_in, d_out, axes,
                                                           name=name)()
    d, f = cfg.d_model, cfg.mlp_dim
    wide = ("wi_gate", "wi_up") if ffn.gated else ("wi",)
    weights = {n: stacked(n, d, f, ("embed", "mlp")) for n in wide}
    weights["wo"] = stacked("wo", f, d, ("mlp", "embed"))
    drop = layers.make_dropout(cfg.ffn_dropout_rate, cfg.dropout_bits)

    def expert_ffn(h, matmul, bias_of):
      """The experts' FFN (layers.dense_ffn's maths): `matmul(h, kernel)`, `bias_of(bias)`."""
      project = lambda z, n: matmul(z, weights[n][0]) + (
          0 if weights[n][1] is None else bias_of(weights[n][1]))
      if ffn.gated:
        hidden = ffn.activation(project(h, "wi_gate")) * project(h, "wi_up")
      else:
        hidden = ffn.activation(project(h, "wi"))
      return project(drop(hidden, deterministic=deterministic), "wo")

    if cfg.moe_capacity_factor > 0:
      y, kept = _capacity_dispatch(
          x, gates, experts, num_experts, capacity(cfg, x.shape[1]),
          lambda h: expert_ffn(h, lambda z, w: jnp.einsum("end,edf->enf", z, w),
                               lambda bias: bias[:, None, :]))
      aux["dropped"] = 1.0 - jnp.mean(kept.astype(jnp.float32))
    else:
      y = _dropless_dispatch(
          x, gates, experts, num_experts,
          lambda h, sizes, expert_of: expert_ffn(
              h, lambda z, w: jax.lax.ragged_dot(z, w, sizes), lambda bias: bias[expert_of]))
      aux["dropped"] = jnp.zeros((), jnp.float32)
    for name in AUX_NAMES:
      self.sow(COLLECTION, name, aux[name])
    if cfg.moe_num_shared_experts:
      shared = dataclasses.replace(cfg, mlp_dim=cfg.moe_num_shared_experts * cfg.mlp_dim)
      shared_ffn = layers.FeedForward(shared, kernels=self.kernels, name="shared")
      y = y + shared_ffn(x, deterministic=deterministic)
    return y


def _capacity_dispatch(x: Array, gates: Array, experts: Array, num_experts: int, slots: int,
                       run: Callable[[Array], Array]) -> tuple[Array, Array]:
  """Per row: (token, choice) pairs in position order fill each expert's `slots` slots; `run`
  maps [E, b * C, d] -> [E, b * C, d] (experts leading: the batch axis of their matmuls). Returns
  (y [b, t, d], kept [b, t, k] bool)."""
  b, t, d = x.shape
  k = experts.shape[-1]
  one_hot = jax.nn.one_hot(experts.reshape(b, t * k), num_experts, dtype=jnp.int32)  # [b, tk, E]
  # Pair j = (token j // k, its choice j % k): its slot is the count of earlier pairs of its expert.
  position = jnp.sum((jnp.cumsum(one_hot, axis=1) - 1) * one_hot, axis=-1).reshape(b, t, k)
  kept = position < slots
  rows = jnp.arange(b)[:, None]
  buffer = jnp.zeros((num_experts, b, slots, d), x.dtype)
  for j in range(k):  # a position past the slots is out of range: scatter drops it. Each slot
    # takes one pair, so add is set, with a plain gather for its gradient.
    buffer = buffer.at[experts[..., j], rows, position[..., j]].add(x, mode="drop")
  out = run(buffer.reshape(num_experts, b * slots, d)).reshape(buffer.shape)
  y = jnp.zeros_like(x)
  for j in range(k):  # a dropped pair reads 0
    back = out.at[experts[..., j], rows, position[..., j]].get(mode="fill", fill_value=0)
    y = y + back * gates[..., j:j + 1].astype(x.dtype)
  return y, kept


def _dropless_dispatch(x: Array, gates: Array, experts: Array, num_experts: int,
                       run: Callable[[Array, Array, Array], Array]) -> Array:
  """Every (token, choice) pair of the batch, sorted by expert (stable: position order within
  one), through `run(rows [n, d], sizes [E], expert_of [n]) -> [n, d]`; y [b, t, d]."""
  b, t, d = x.shape
  k = experts.shape[-1]
  flat = experts.reshape(-1)  # [b t k]
  order = jnp.argsort(flat, stable=True)
  rows = jnp.take(x.reshape(b * t, d), order // k, axis=0)
  sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
  out = run(rows, sizes, flat[order])
  unsorted = jnp.zeros_like(out).at[order].set(out, unique_indices=True)
  return jnp.sum(unsorted.reshape(b, t, k, d) * gates[..., None].astype(x.dtype), axis=2)


def aux_metrics(collection: Any, num_experts: int) -> dict[str, Array]:
  """A forward pass's sown 'moe' collection -> balance_loss and z_loss summed over layers, the
  dropped fraction and the per-expert load [E] averaged over layers (scan: leaves [L, ...])."""
  groups: dict[str, list[Array]] = {n: [] for n in AUX_NAMES}
  for path, value in traverse_util.flatten_dict(collection).items():
    name = next(p for p in reversed(path) if p in groups)
    groups[name] += [jnp.asarray(v) for v in jax.tree.leaves(value)]
  if not groups["load"]:
    raise ValueError("no MoE layer sowed into the 'moe' collection")
  load = jnp.concatenate([v.reshape(-1, num_experts) for v in groups["load"]])
  dropped = jnp.concatenate([v.reshape(-1) for v in groups["dropped"]])
  return dict(balance_loss=sum(jnp.sum(v) for v in groups["balance_loss"]),
              z_loss=sum(jnp.sum(v) for v in groups["z_loss"]),
              load=jnp.mean(load, axis=0), dropped=jnp.mean(dropped))

