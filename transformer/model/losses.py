"""Token-level cross-entropy with label smoothing, weights and z-loss, plain or chunked over the
output layer. Sums, never means: divide by the summed weights once, at the end."""

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def cross_entropy(logits: Array, targets: Array, weights: Array | None = None,
                  label_smoothing: float | Array = 0.0, z_loss: float = 0.0,
                  excluded: Sequence[int] = ()) -> tuple[Array, Array, Array]:
  """Summed smoothed cross-entropy (loss_sum incl. z-loss, z_loss_sum, weight_sum), float32, of
  logits [b, t, v], targets [b, t] int, weights [b, t] (None = ones). The smoothed target puts
  1 - label_smoothing on the true class, the rest evenly on the others but the `excluded` ids;
  its entropy is subtracted (a perfect prediction scores 0). z-loss: z_loss * logsumexp**2."""
  if logits.ndim != targets.ndim + 1 or logits.shape[:-1] != targets.shape:
    raise ValueError(f"cross_entropy: logits {logits.shape} do not match targets {targets.shape}")
  if weights is not None and weights.shape != targets.shape:
    raise ValueError(f"cross_entropy: weights {weights.shape} do not match targets {targets.shape}")
  # A traced label_smoothing (vmapped members) was checked as a config value (transformer.config).
  if isinstance(label_smoothing, (int, float)) and not 0.0 <= label_smoothing < 1.0:
    raise ValueError(f"cross_entropy: label_smoothing={label_smoothing} must be in [0, 1)")
  logits = logits.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)  # [b, t]
  log_p = logits - log_z[..., None]  # [b, t, v]
  vocab = logits.shape[-1] - len(set(excluded))
  confidence = 1.0 - label_smoothing
  low = label_smoothing / (vocab - 1) if vocab > 1 else 0.0
  # -sum_c q_c log p_c with q = low everywhere and `confidence` on the target, without a one-hot.
  target_log_p = jnp.take_along_axis(log_p, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  nll = -(confidence - low) * target_log_p
  if not isinstance(low, float) or low:  # a traced rate (vmapped members) is never known 0
    if excluded:
      kept = ~np.isin(np.arange(logits.shape[-1]), list(excluded))
      log_p = jnp.where(kept, log_p, 0.0)
    nll = nll - low * jnp.sum(log_p, axis=-1)
  # Entropy of the smoothed target (xlogy(0, 0) = 0), a constant.
  entropy = -(jax.scipy.special.xlogy(confidence, confidence)
              + (vocab - 1) * jax.scipy.special.xlogy(low, low))
  z = z_loss * jnp.square(log_z)
  loss = nll - entropy + z
  weights = jnp.ones(targets.shape, jnp.float32) if weights is None else weights.astype(jnp.float32)
  keep = weights != 0
  loss_sum = jnp.sum(jnp.where(keep, loss * weights, 0.0))
  z_sum = jnp.sum(jnp.where(keep, z * weights, 0.0))
  return loss_sum, z_sum, jnp.sum(weights)


def chunked_cross_entropy(hidden: Array, project, targets: Array, weights: Array | None = None,
                          label_smoothing: float = 0.0, z_loss: float = 0.0,
                          chunk_tokens: int = 8192, excluded: Sequence[int] = ()
                          ) -> tuple[Array, Array, Array]:
  """cross_entropy(project(hidden), ...) for hidden [b, t, d], chunk_tokens // b positions at a
  time (lax.map, jax.checkpoint): equal up to summation order, without the batch's logits."""
  if hidden.ndim != 3 or hidden.shape[:2] != targets.shape:
    raise ValueError(f"chunked_cross_entropy: hidden {hidden.shape} does not match targets "
                     f"{targets.shape}")
  if chunk_tokens < 1:
    raise ValueError(f"chunked_cross_entropy: chunk_tokens={chunk_tokens} must be >= 1")
  b, t, d = hidden.shape
  if weights is None:
    weights = jnp.ones(targets.shape, jnp.float32)
  if weights.shape != targets.shape:
    raise ValueError(f"cross_entropy: weights {weights.shape} do not match targets {targets.shape}")
  length = min(t, max(1, chunk_tokens // b))
  chunks = -(-t // length)
  pad = chunks * length - t

  def split(x):  # [b, t, ...] -> [chunks, b, length, ...]
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    return jnp.swapaxes(x.reshape(b, chunks, length, *x.shape[2:]), 0, 1)

  @jax.checkpoint
  def one(piece):
    h, y, w = piece
    return cross_entropy(project(h), y, w, label_smoothing, z_loss, excluded)[:2]

  loss_sums, z_sums = jax.lax.map(one, (split(hidden), split(targets), split(weights)))
  return jnp.sum(loss_sums), jnp.sum(z_sums), jnp.sum(weights.astype(jnp.float32))
