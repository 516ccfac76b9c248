"""Parameter and training-FLOP counts of a model config, from the code that reports MFU.

Parameters are counted on the model itself (`jax.eval_shape` of its init, no memory used):
`total`, `embedding` (the lookup tables: every leaf named `embedding`, i.e. token, source, target
and learned position tables) and `non_embedding` (the rest, Kaplan et al. 2020's N; an untied
output projection is a matmul and counts here). Training FLOPs are run/reporting.py's
`model_flops_per_step`, the number MFU divides by: matmuls only, forward + backward = 3 x forward,
attention's projections and its full t x s score and value products included, the output head
(d x vocab per token) included; norms, activations, softmax and the optimizer left out.
"""

import dataclasses
import math
from typing import Any

import jax

from transformer.model import models
from transformer.run import reporting


@dataclasses.dataclass(frozen=True)
class Counts:
  """A model's parameters and the training FLOPs of one token (one target token per row-token)."""
  total: int
  embedding: int
  non_embedding: int
  flops_per_token: float  # forward + backward matmul FLOPs per training token


def parameter_counts(model_cfg: Any) -> tuple[int, int]:
  """(total, embedding) parameters that `model_cfg` builds; unset vocabularies count 1."""
  cfg = dataclasses.replace(model_cfg, vocab_size=model_cfg.vocab_size or 1,
                            source_vocab_size=model_cfg.source_vocab_size or 1)
  shapes = jax.eval_shape(lambda: models.batch_init(
      models.build_model(cfg), {"params": jax.random.key(0)}, models.example_batch(cfg, 1)))
  total = embedding = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(shapes["params"])[0]:
    size = math.prod(leaf.shape)
    total += size
    names = [str(getattr(p, "key", p)) for p in path]
    embedding += size if "embedding" in names else 0
  return total, embedding


def tokens_per_step(config: Any) -> int:
  """Training tokens of one step: batch rows x the row length the model is trained on (targets;
  an encoder-only model's sources). A packed LM row is all tokens."""
  d = config.data
  length = d.max_source_len if config.model.arch == "encoder_only" else d.max_target_len
  return d.batch_size * length


def flops_per_token(config: Any) -> float:
  """Training FLOPs (forward + backward matmuls) per token: MFU's count of one step over
  `tokens_per_step`."""
  d = config.data
  step = reporting.model_flops_per_step(config.model, d.batch_size, d.max_source_len,
                                        d.max_target_len)
  return step / tokens_per_step(config)


def count(config: Any) -> Counts:
  """Counts of a validated Config (model.vocab_size filled in: a run's config.json has it)."""
  total, embedding = parameter_counts(config.model)
  return Counts(total, embedding, total - embedding, flops_per_token(config))
