"""FLOP accounting for MFU: model FLOPs per training step and the peak FLOP/s of a device.

MFU = model FLOPs per step * steps per second / (devices * peak FLOP/s per device). Model FLOPs
count the matmuls of forward + backward (backward = 2 x forward) per layer; elementwise work and
rematerialisation are excluded, as in the usual definition (Chowdhery et al. 2022, appendix B).
CPUs have no table entry: pass `measure_matmul_flops()` as `--config.peak_flops`.
"""

import time
from typing import Any

import jax

# Peak dense bf16 FLOP/s per chip, from the vendors' spec pages: Google Cloud TPU system
# architecture docs (v4 275, v5e 197, v5p 459, v6e 918 TFLOP/s); NVIDIA A100 datasheet (312);
# NVIDIA H100 datasheet (SXM 989, PCIe 756: the 1979/1513 figures there assume 2:4 sparsity);
# NVIDIA H200 datasheet (989, same tensor cores as H100 SXM). Matched against
# jax.devices()[0].device_kind, in order (first substring that matches wins).
PEAK_BF16_FLOPS = (
    ("v5 lite", 197e12), ("v5e", 197e12), ("v5p", 459e12), ("tpu v5", 459e12),
    ("v6 lite", 918e12), ("v6e", 918e12), ("tpu v4", 275e12),
    ("h200", 989e12), ("h100 pcie", 756e12), ("h100", 989e12), ("a100", 312e12),
)


def peak_flops(device_kind: str, override: float = 0.0) -> float | None:
  """Peak FLOP/s of one device: `override` if > 0, else the table above; None if unknown (CPU)."""
  if override and override > 0:
    return float(override)
  kind = device_kind.lower()
  for key, value in PEAK_BF16_FLOPS:
    if key in kind:
      return value
  return None


def _attention_flops(cfg: Any, t: int, s: int) -> int:
  """Forward FLOPs of one attention layer for one example: t queries over s keys/values."""
  n, k, h, hv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.v_head_dim, cfg.d_model
  projections = 2 * t * d * n * h + 2 * s * d * k * (h + hv) + 2 * t * n * hv * d  # q, kv, out
  return projections + 2 * t * s * n * h + 2 * t * s * n * hv  # scores q.k, weights.v


def _ffn_flops(cfg: Any, t: int) -> int:
  """Forward FLOPs of one feed-forward layer for t tokens (gated variants have 3 matrices)."""
  matrices = 3 if cfg.ffn in ("swiglu", "geglu") else 2
  return 2 * t * cfg.d_model * cfg.mlp_dim * matrices


def model_flops_per_step(model_cfg: Any, batch_size: int, source_len: int, target_len: int,
                         arch: str | None = None) -> int:
  """Matmul FLOPs of one training step (forward + backward) on a batch of padded/packed rows.

  decoder_only rows hold `target_len` tokens, encoder_only rows `source_len`. Attention counts the
  full t x s score matrix (what the einsum path computes whatever the mask); tied shared
  embeddings use the whole shared table. Scheduled sampling's extra decoder pass is not included.
  """
  cfg = model_cfg
  arch = arch or cfg.arch
  vocab = cfg.vocab_size
  if vocab <= 0:
    raise ValueError("model.vocab_size is 0: fill it in from the tokenizer before counting FLOPs")
  t = target_len
  if arch == "encoder_decoder":
    s = source_len
    if cfg.tie_embeddings and cfg.share_src_tgt_embeddings:
      vocab = max(vocab, cfg.source_vocab_size)
    encoder = cfg.num_encoder_layers * (_attention_flops(cfg, s, s) + _ffn_flops(cfg, s))
    decoder = cfg.num_decoder_layers * (_attention_flops(cfg, t, t) + _attention_flops(cfg, t, s)
                                        + _ffn_flops(cfg, t))
  elif arch == "decoder_only":
    encoder = 0
    decoder = cfg.num_decoder_layers * (_attention_flops(cfg, t, t) + _ffn_flops(cfg, t))
  elif arch == "encoder_only":  # rows of source_len tokens; the head's output over them
    t, decoder = source_len, 0
    encoder = cfg.num_encoder_layers * (_attention_flops(cfg, t, t) + _ffn_flops(cfg, t))
    vocab = vocab if cfg.head == "mlm" else cfg.num_classes
  else:
    raise ValueError(f"model.arch={arch!r} is not one of encoder_decoder|decoder_only|encoder_only")
  forward = encoder + decoder + 2 * t * cfg.d_model * vocab
  return 3 * batch_size * forward  # backward: gradients w.r.t. both operands = 2 x forward


def measure_matmul_flops(n: int = 1024, dtype: str = "float32", repeats: int = 5) -> float:
  """FLOP/s of one jitted n x n matmul on the default device, best of `repeats` (a CPU "peak")."""
  a = jax.numpy.ones((n, n), dtype)
  matmul = jax.jit(lambda x: x @ x)
  matmul(a).block_until_ready()  # compile
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * n**3 / best


def mfu(flops_per_step: float, seconds_per_step: float, num_devices: int,
        peak_flops_per_device: float | None) -> float | None:
  """Model FLOPs utilisation in [0, 1]; None when the peak is unknown."""
  if not peak_flops_per_device or seconds_per_step <= 0:
    return None
  return flops_per_step / seconds_per_step / (num_devices * peak_flops_per_device)

