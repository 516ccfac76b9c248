"""Token-level cross-entropy with label smoothing, per-token weights and z-loss.

Returns sums, never means, so that averaging over gradient-accumulation steps and devices is
exact: divide the summed losses by the summed weights once, at the end.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def cross_entropy(logits: Array, targets: Array, weights: Array | None = None,
                  label_smoothing: float | Array = 0.0, z_loss: float = 0.0) -> tuple[Array, Array, Array]:
  """Summed smoothed cross-entropy: (loss_sum incl. z-loss, z_loss_sum, weight_sum), float32.

  logits [b, t, v], targets [b, t] int, weights [b, t] (None = all ones). The smoothed target puts
  1 - label_smoothing on the true class and label_smoothing / (v - 1) on each other class; the
  entropy of that target is subtracted, so a prediction equal to the target scores exactly 0.
  The z-loss term is z_loss * logsumexp(logits)**2 per token (Chowdhery et al. 2022); it is both
  included in loss_sum (the training objective) and returned alone for logging. Positions with
  weight 0 contribute nothing, even if their logits are garbage.
  """
  if logits.ndim != targets.ndim + 1 or logits.shape[:-1] != targets.shape:
    raise ValueError(f"cross_entropy: logits {logits.shape} do not match targets {targets.shape}")
  if weights is not None and weights.shape != targets.shape:
    raise ValueError(f"cross_entropy: weights {weights.shape} do not match targets {targets.shape}")
  # A traced label_smoothing (vmapped members) was checked as a config value (transformer.config).
  if isinstance(label_smoothing, (int, float)) and not 0.0 <= label_smoothing < 1.0:
    raise ValueError(f"cross_entropy: label_smoothing={label_smoothing} must be in [0, 1)")
  vocab = logits.shape[-1]
  logits = logits.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)  # [b, t]
  log_p = logits - log_z[..., None]  # [b, t, v]
  confidence = 1.0 - label_smoothing
  low = label_smoothing / (vocab - 1) if vocab > 1 else 0.0
  # -sum_c q_c log p_c with q = low everywhere and `confidence` on the target, without a one-hot.
  target_log_p = jnp.take_along_axis(log_p, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  nll = -(confidence - low) * target_log_p - low * jnp.sum(log_p, axis=-1)
  # Entropy of the smoothed target (xlogy(0, 0) = 0), a constant.
  entropy = -(jax.scipy.special.xlogy(confidence, confidence)
              + (vocab - 1) * jax.scipy.special.xlogy(low, low))
  z = z_loss * jnp.square(log_z)
  loss = nll - entropy + z
  if weights is None:
    weights = jnp.ones(targets.shape, jnp.float32)
  weights = weights.astype(jnp.float32)
  keep = weights != 0
  loss_sum = jnp.sum(jnp.where(keep, loss * weights, 0.0))
  z_sum = jnp.sum(jnp.where(keep, z * weights, 0.0))
  return loss_sum, z_sum, jnp.sum(weights)
