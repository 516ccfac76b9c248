"""Teacher-forced scores, as training and evaluation both report them (`make_eval_step`,
`teacher_forced_metrics`), and a model's initial parameters (`init_params`)."""

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import choices, metrics as metrics_lib
from transformer.config import ConfigError
from transformer.model import ensemble, models, moe
from transformer.model.losses import cross_entropy

Array = jax.Array
PyTree = Any


# A mixture of experts' evaluation metrics (moe.aux_metrics' scalars), averaged over tokens.
MOE_METRICS = ("balance_loss", "z_loss", "dropped")


def target_weights(batch: dict[str, Any]) -> Array:
  """The batch's loss weights: its 'weights' feature, else 1 on non-padding targets (id != 0)."""
  weights = batch.get("weights")
  return (batch["targets"] != 0).astype(jnp.float32) if weights is None else weights


def num_classes(model_config: Any) -> int:
  """The classes a classification or tagging head predicts; 0 for vocabulary logits."""
  m = model_config
  return m.num_classes if m.arch == "encoder_only" and m.head != "mlm" else 0


def class_counts(predicted: Array, targets: Array, weights: Array, classes: int
                 ) -> dict[str, Array]:
  """Per-class weighted counts [c] of predictions [b, t] against targets [b, t] (each position
  counted with its weight, once): true_positives, predicted, references, and the confusion
  matrix [reference, predicted]."""
  pred = jax.nn.one_hot(predicted, classes)  # [b, t, c]
  true = jax.nn.one_hot(targets, classes) * weights[..., None]
  return dict(true_positives=jnp.sum(pred * true, (0, 1)),
              predicted=jnp.sum(pred * weights[..., None], (0, 1)),
              references=jnp.sum(true, (0, 1)), confusion=jnp.einsum("btr,btp->rp", true, pred))


def make_eval_step(model: nn.Module | tuple[nn.Module, ...]) -> Callable:
  """`eval_step(params, batch) -> sums` (unsmoothed loss, correct tokens, weight; per-class counts
  for classification and tagging heads; a mixture of experts' auxiliary losses and dropped
  fraction, times the weight; the confusion counts [reference, predicted] for classification and
  tagging heads). A tuple of models scores their mean probabilities."""
  members = tuple(model) if ensemble.is_ensemble(model) else (model,)
  ensemble.check_compatible([m.config for m in members])
  classes = num_classes(members[0].config)
  mixture = len(members) == 1 and choices.FFNS[members[0].config.ffn].mixture

  def eval_step(params, batch):
    batch = {k: v for k, v in batch.items() if v is not None}
    _, trees = ensemble.members(model, params)
    if mixture:
      logits, sown = models.batch_logits(members[0], trees[0], batch, mutable=[moe.COLLECTION])
    else:
      logits = ensemble.log_mean_probs([models.batch_logits(m, p, batch)
                                        for m, p in zip(members, trees)])
    weights = target_weights(batch)
    loss_sum, _, weight_sum = cross_entropy(logits, batch["targets"], weights)
    predicted = jnp.argmax(logits, -1)
    correct = (predicted == batch["targets"]).astype(jnp.float32)
    sums = dict(loss_sum=loss_sum, weight_sum=weight_sum, correct_sum=jnp.sum(correct * weights))
    if mixture:
      aux = moe.aux_metrics(sown[moe.COLLECTION], members[0].config.moe_num_experts)
      sums |= {f"moe_{k}_sum": aux[k] * weight_sum for k in MOE_METRICS}
    if classes:
      sums |= class_counts(predicted, batch["targets"], weights, classes)
    return sums

  return eval_step


def teacher_forced_names(model_config: Any) -> list[str]:
  """The names teacher_forced_metrics gives the evaluation sums of a model of `model_config`."""
  m = model_config
  names = ["loss", "accuracy", "perplexity", "scored_tokens"]
  if choices.FFNS[m.ffn].mixture:
    names += [f"moe_{k}" for k in MOE_METRICS]
  if m.arch == "encoder_only" and m.head != "mlm":
    names.append("f1")
  return names


def in_training_metrics(cfg: Any) -> list[str]:
  """The eval/<name> keys an in-training evaluation of `cfg` may log: the teacher-forced ones
  and, where the task may decode (not encoder-only, no objective), the decoded ones of
  eval.metrics (wer and per with their _stress tracks) and decoded_examples; the dataset decides
  among those (a language model decodes none)."""
  names = teacher_forced_names(cfg.model)
  if cfg.model.arch != "encoder_only" and cfg.data.objective == "none":
    decoded = (["wer", "per", "bleu"] if cfg.eval.metrics == "auto" else
               [m.strip() for m in cfg.eval.metrics.split(",") if m.strip() != "bpc"])
    names += [n for m in decoded for n in ((m, m + "_stress") if m in ("wer", "per") else (m,))]
    names += ["decoded_examples"] if decoded else []
  return ["eval/" + n for n in names]


def check_in_training_metric(cfg: Any, key: str, value: str) -> None:
  """Raises ConfigError unless `value` (of flag or key `key`) is a metric in_training_metrics
  names (dev/<name> read as eval/<name>)."""
  logged = in_training_metrics(cfg)
  if ("eval/" + value[len("dev/"):] if value.startswith("dev/") else value) not in logged:
    raise ConfigError(f"{key}={value!r} is not a metric this config's in-training evaluations "
                      f"log; they log {', '.join(logged)}")


def teacher_forced_metrics(sums: dict[str, float], prefix: str = "") -> dict[str, float]:
  """Eval-step sums over a split -> loss (a token average), accuracy, perplexity, scored_tokens
  and, with per-class counts, macro `f1`, with a mixture's sums its moe_* token averages; each
  key with `prefix`."""
  w = max(float(sums["weight_sum"]), 1.0)
  loss = float(sums["loss_sum"]) / w
  out = {"loss": loss, "accuracy": float(sums["correct_sum"]) / w,
         "perplexity": metrics_lib.perplexity(loss), "scored_tokens": float(sums["weight_sum"])}
  out |= {f"moe_{k}": float(sums[f"moe_{k}_sum"]) / w for k in MOE_METRICS
          if f"moe_{k}_sum" in sums}
  if "true_positives" in sums:
    out["f1"] = metrics_lib.macro_f1(sums["true_positives"], sums["predicted"], sums["references"])
  return {prefix + k: v for k, v in out.items()}


def init_params(model: nn.Module, rng: Array, example_batch: dict[str, Any],
                unbox: bool = True) -> PyTree:
  """Initial parameters from an example batch (only shapes matter); boxed keeps logical axes."""
  batch = {k: jnp.asarray(v) for k, v in example_batch.items() if v is not None}

  @jax.jit  # op-by-op init of even a tiny model takes seconds; compiled it is one call
  def init(key, batch):
    return models.batch_init(model, {"params": key, "dropout": key}, batch)

  variables = init(rng, batch)
  return nn.meta.unbox(variables["params"]) if unbox else variables["params"]
