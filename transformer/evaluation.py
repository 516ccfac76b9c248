"""Evaluation of a trained run: restore, teacher-forced metrics, decoding, task metrics, predictions.

`evaluate(workdir, split, step, overrides)` is what `eval.py` runs:
  1. the run's config is read from `<workdir>/config.json` (written by training, vocabulary sizes
     filled in); `overrides` (a flat {"eval.decode.beam_size": 4} dict, as from `--config.*`
     flags) are applied on top. Only keys that cannot change the parameters may be overridden
     (OVERRIDABLE); anything else is a one-line ConfigError;
  2. the train state of `step` (None|'latest', 'best' or an int) is restored onto one device;
  3. teacher-forced loss / token accuracy / perplexity over `eval.num_batches` batches (0 = all);
  4. `eval.num_decode_examples` examples (0 = all) are decoded with `eval.decode` (batched
     `generate`) and scored with the task's metrics (METRICS below);
  5. `predictions.<split>.jsonl` and `metrics.<split>.json` are written and a table is printed.

Task metrics, chosen by `eval.metrics` ("auto" or a comma list):
  wer, per    G2P: a word is right if its hypothesis equals any reference; PER takes the closest
              reference (transformer.metrics.wer_per). Computed on the no-stress track (stress
              digits removed from hypotheses and references); when the references carry stress,
              also `wer_stress`, `per_stress` on the phones as written.
  bleu        corpus BLEU (sacrebleu 13a) of the detokenised hypotheses.
  bpc         LM: bits per token, named bits_per_char / bits_per_byte for char / byte tokenizers.
"auto" is wer,per for seq2seq tasks whose target tokenizer is `symbol` (phones), bleu for other
seq2seq tasks and bpc for language models (which also get a few sampled continuations).
`decode_metrics(...)` is the piece the training loop calls for its in-training evaluations.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer import files
from transformer import metrics as metrics_lib
from transformer import reporting
from transformer.config import Config, ConfigError, DecodeConfig, from_configdict

# Keys `overrides` may change: none of them changes parameter shapes or what was trained.
OVERRIDABLE_PREFIXES = ("eval.",)
OVERRIDABLE_KEYS = frozenset({
    "seed", "data.data_dir", "data.eval_split", "data.batch_size",
    "model.attention_impl", "model.dtype"})
STEP_NAMES = ("latest", "best")
_STRESS = re.compile(r"\d")
NUM_LM_SAMPLES = 4  # continuations sampled for a language model
LM_PROMPT_LEN = 16  # tokens of each eval row used as an LM prompt


class EvaluationError(ValueError):
  """A workdir, step or split that cannot be evaluated; the message is one line naming it."""


# ----------------------------------------------------------------------------- config and restore


def load_config(workdir: str, overrides: dict[str, Any] | None = None) -> Config:
  """The run's Config from `<workdir>/config.json` with `overrides` (flat dotted keys) applied."""
  path = os.path.join(workdir, "config.json")
  if not files.exists(path):
    raise EvaluationError(f"{path} not found: is {workdir!r} the --workdir of a training run?")
  try:
    saved = json.loads(files.read_text(path))
  except json.JSONDecodeError as e:
    raise EvaluationError(f"{path}: not valid JSON ({e})") from None
  cd = ml_collections.ConfigDict(saved)
  for key, value in (overrides or {}).items():
    if not (key.startswith(OVERRIDABLE_PREFIXES) or key in OVERRIDABLE_KEYS):
      raise ConfigError(f"--config.{key} cannot be overridden at evaluation (it would not match "
                        f"the trained parameters); allowed: eval.*, {', '.join(sorted(OVERRIDABLE_KEYS))}")
    try:
      cd.update_from_flattened_dict({key: value})
    except (KeyError, AttributeError, TypeError) as e:
      raise ConfigError(f"--config.{key}={value!r}: {str(e).splitlines()[0]}") from None
  return from_configdict(cd)


def resolve_step(checkpointer: Any, step: int | str | None) -> int:
  """None/'latest' -> the newest step, 'best' -> the best by checkpoint.keep_best_by, int -> it."""
  if isinstance(step, str) and step not in STEP_NAMES:
    try:
      step = int(step)
    except ValueError:
      raise EvaluationError(f"--step={step!r} must be an integer, 'latest' or 'best'") from None
  available = checkpointer.all_steps()
  if not available:
    raise EvaluationError(f"no checkpoints in {checkpointer.directory}")
  if step is None or step == "latest":
    return int(checkpointer.latest_step())
  if step == "best":
    best = checkpointer.best_step()
    if best is None:
      raise EvaluationError(f"no best checkpoint in {checkpointer.directory} (checkpoint."
                            f"keep_best_by is unset or never logged); use --step=latest")
    return int(best)
  if int(step) not in available:
    raise EvaluationError(f"no checkpoint for step {step} in {checkpointer.directory} "
                          f"(steps: {available})")
  return int(step)


def _dummy_batch(cfg: Config) -> dict[str, np.ndarray]:
  """A one-row batch with the right features; parameter shapes never depend on its length."""
  ones = np.ones((1, 4), np.int32)
  return dict(inputs=ones, targets=ones) if cfg.model.arch == "encoder_decoder" else dict(targets=ones)


def _read_state(directory: str, step: int) -> dict[str, Any]:
  """The saved train state of `step` as nested dicts, on the first local device.

  The target structure comes from the checkpoint's own metadata, not from today's optimizer code,
  so a run restores for evaluation even if the optimizer state layout has changed since.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)  # orbax warns about every item it is not asked for
  manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(read_only=True),
                                  item_handlers={"state": ocp.StandardCheckpointHandler()})
  try:
    tree = manager.item_metadata(step)["state"]
    tree = getattr(tree, "tree", tree)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), tree)
    return manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
                           )["state"]
  finally:
    manager.close()
    logging.set_verbosity(verbosity)


def _check_params(cfg: Config, model: Any, params: Any, where: str) -> None:
  """Raises EvaluationError naming the first parameter whose shape differs from the model's."""
  from transformer import training  # pylint: disable=g-import-not-at-top
  expected = jax.eval_shape(lambda r: training.init_params(cfg, model, r, _dummy_batch(cfg)),
                            jax.random.PRNGKey(0))
  flat = lambda tree: {jax.tree_util.keystr(k): tuple(v.shape)  # noqa: E731
                       for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}
  want, got = flat(expected), flat(params)
  for key in sorted(set(want) | set(got)):
    if want.get(key) != got.get(key):
      raise EvaluationError(f"{where}: parameter {key} has shape {got.get(key)} but the config in "
                            f"config.json builds {want.get(key)}")


def restore_params(cfg: Config, workdir: str, step: int | str | None = None) -> tuple[Any, int]:
  """(params, step) of a checkpoint in `workdir`, restored onto the first local device."""
  from transformer import checkpoints  # pylint: disable=g-import-not-at-top
  from transformer.models import build_model  # pylint: disable=g-import-not-at-top
  if not files.isdir(os.path.join(workdir, "checkpoints")):
    raise EvaluationError(f"no checkpoints in {workdir}: has the run saved one yet?")
  ckpt = checkpoints.Checkpointer(workdir, cfg.checkpoint)
  try:
    step = resolve_step(ckpt, step)
    directory = ckpt.directory
  finally:
    ckpt.close()
  params = _read_state(directory, step)["params"]
  _check_params(cfg, build_model(cfg.model), params, f"{directory}/{step}")
  return params, step


# ----------------------------------------------------------------------------- decoding


def source_ids(task: Any, text: str) -> list[int]:
  """The encoder input (or decoder-only prompt) ids of `text`, as the data pipeline builds them.

  Uses `task.encode_source` when the task provides it; otherwise the source tokenizer's ids + EOS
  (the target tokenizer's ids without EOS for language models).
  """
  if hasattr(task, "encode_source"):
    return list(task.encode_source(text))
  if getattr(task, "kind", "seq2seq") == "lm" or task.source_tokenizer is None:
    return list(task.target_tokenizer.encode(text))
  tok = task.source_tokenizer
  return list(tok.encode(text)) + [tok.eos_id]


def decode_batches(cfg: Config, model: Any, params: Any, ids: Sequence[Sequence[int]],
                   decode_cfg: DecodeConfig | None = None, *, eos_id: int,
                   batch_size: int = 0, rng: jax.Array | None = None,
                   prefix_lm: bool | None = None) -> tuple[list[list[int]], list[float]]:
  """Decodes every id list in `ids` (batched, fixed shapes): (token lists up to EOS, scores).

  Encoder-decoder: the ids are the encoder inputs; decoder-only: the prompts, attended
  bidirectionally when `prefix_lm` (None = model.prefix_lm; language models pass False, as they
  were trained without a prefix).
  The last batch is filled with copies of its first row so every batch compiles to one program.
  """
  from transformer.decoding import generate  # pylint: disable=g-import-not-at-top
  decode_cfg = decode_cfg or cfg.eval.decode
  if not ids:
    return [], []
  b = batch_size or min(cfg.eval.batch_size or cfg.data.batch_size, 64)
  width = max(max(len(x) for x in ids), 1)
  if cfg.model.arch == "encoder_decoder":
    width = max(width, cfg.data.max_source_len)
  max_decode_len = decode_cfg.max_decode_len or cfg.data.max_target_len
  key = "inputs" if cfg.model.arch == "encoder_decoder" else "prompt"
  if key == "prompt" and not decode_cfg.max_decode_len:
    # The prompt and its continuation share the model.max_len cache: by default decode what fits
    # (an LM's max_target_len is usually the whole context, so prompt + it would not).
    max_decode_len = min(max_decode_len, cfg.model.max_len - width)
    if max_decode_len < 1:
      raise EvaluationError(f"a prompt of {width} tokens leaves no room to decode within "
                            f"model.max_len={cfg.model.max_len}")
  tokens_out, scores_out = [], []
  for start in range(0, len(ids), b):
    chunk = list(ids[start:start + b])
    rows = chunk + [chunk[0]] * (b - len(chunk))
    array = np.zeros((b, width), np.int32)
    for r, row in enumerate(rows):
      array[r, :len(row)] = row
    sub = None if rng is None else jax.random.fold_in(rng, start)
    tokens, scores = generate(model, params, {key: jnp.asarray(array)}, decode_cfg, eos_id=eos_id,
                              max_decode_len=max_decode_len, rng=sub, prefix_lm=prefix_lm)
    tokens, scores = np.asarray(tokens), np.asarray(scores)
    for r in range(len(chunk)):
      row = [int(t) for t in tokens[r]]
      tokens_out.append(row[:row.index(eos_id)] if eos_id in row else [t for t in row if t])
      scores_out.append(float(scores[r]))
  return tokens_out, scores_out


def decode_split(cfg: Config, model: Any, params: Any, task: Any, split: str,
                 num_examples: int = 0, decode_cfg: DecodeConfig | None = None
                 ) -> list[dict[str, Any]]:
  """Decodes (the first `num_examples` of) a seq2seq split: [{source, references, hypothesis, score}]."""
  examples = list(task.eval_examples(split))
  if num_examples:
    examples = examples[:num_examples]
  tok = task.target_tokenizer
  ids = [source_ids(task, e["source"]) for e in examples]
  rng = jax.random.key(cfg.seed)
  tokens, scores = decode_batches(cfg, model, params, ids, decode_cfg, eos_id=tok.eos_id, rng=rng)
  return [dict(source=e["source"], references=list(e["references"]), hypothesis=tok.decode(t),
               score=s) for e, t, s in zip(examples, tokens, scores)]


def sample_continuations(cfg: Config, model: Any, params: Any, task: Any, split: str,
                         count: int = NUM_LM_SAMPLES) -> list[dict[str, Any]]:
  """LM: prompts from the first eval rows, continued with eval.decode: [{source, references, ...}]."""
  tok = task.target_tokenizer
  prompts, truths = [], []
  for batch in task.eval_batches(split):
    for row in np.asarray(batch["targets"]):
      row = [int(t) for t in row if t]
      if len(row) > LM_PROMPT_LEN:
        prompts.append(row[:LM_PROMPT_LEN])
        truths.append(row[LM_PROMPT_LEN:])
      if len(prompts) == count:
        break
    if len(prompts) == count:
      break
  decode_cfg = dataclasses.replace(cfg.eval.decode, max_decode_len=min(
      cfg.eval.decode.max_decode_len or 64, cfg.model.max_len - LM_PROMPT_LEN))
  tokens, scores = decode_batches(cfg, model, params, prompts, decode_cfg, eos_id=tok.eos_id,
                                  batch_size=len(prompts) or 1, rng=jax.random.key(cfg.seed),
                                  prefix_lm=False)
  return [dict(source=tok.decode(p), references=[tok.decode(t[:len(h)])], hypothesis=tok.decode(h),
               score=s) for p, t, h, s in zip(prompts, truths, tokens, scores)]


# ----------------------------------------------------------------------------- task metrics


def metric_names(cfg: Config, task: Any) -> list[str]:
  """The task metrics to compute: eval.metrics, or by task for 'auto'."""
  if cfg.eval.metrics != "auto":
    names = [m.strip() for m in cfg.eval.metrics.split(",") if m.strip()]
    unknown = sorted(set(names) - {"wer", "per", "bleu", "bpc"})
    if unknown:
      raise ConfigError(f"eval.metrics={cfg.eval.metrics!r}: unknown {unknown} (wer,per,bleu,bpc)")
    return names
  if getattr(task, "kind", "seq2seq") == "lm":
    return ["bpc"]
  return ["wer", "per"] if getattr(task.target_tokenizer, "kind", "") == "symbol" else ["bleu"]


def strip_stress(phones: str) -> str:
  """'HH AH0 L OW1' -> 'HH AH L OW' (CMUdict stress digits removed)."""
  return _STRESS.sub("", phones)


def prediction_metrics(names: Iterable[str], predictions: Sequence[dict[str, Any]]
                       ) -> dict[str, float]:
  """Corpus metrics (wer/per with stress tracks, bleu) of prediction records; {} when empty."""
  names = set(names)
  if not predictions:
    return {}
  out: dict[str, float] = {}
  hyps = [p["hypothesis"] for p in predictions]
  refs = [p["references"] for p in predictions]
  if names & {"wer", "per"}:
    split = lambda s: s.split()  # noqa: E731
    wer, per = metrics_lib.wer_per([split(strip_stress(h)) for h in hyps],
                                   [[split(strip_stress(r)) for r in rs] for rs in refs])
    out.update({k: v for k, v in (("wer", wer), ("per", per)) if k in names})
    if any(_STRESS.search(r) for rs in refs for r in rs):
      wer, per = metrics_lib.wer_per([split(h) for h in hyps], [[split(r) for r in rs] for rs in refs])
      out.update({f"{k}_stress": v for k, v in (("wer", wer), ("per", per)) if k in names})
  if "bleu" in names:
    counts = {len(rs) for rs in refs}
    bleu_refs = refs if len(counts) == 1 else [rs[0] for rs in refs]
    out["bleu"] = metrics_lib.bleu(hyps, bleu_refs)
  return out


def decode_metrics(cfg: Config, model: Any, params: Any, task: Any, split: str,
                   num_examples: int = 0, prefix: str = "eval/") -> dict[str, float]:
  """Task metrics (WER/PER or BLEU) from decoding `split`; {} for language models.

  The training loop's in-training evaluation calls this with the eval split.
  """
  if getattr(task, "kind", "seq2seq") == "lm":
    return {}
  predictions = decode_split(cfg, model, params, task, split, num_examples)
  return {prefix + k: v for k, v in prediction_metrics(metric_names(cfg, task), predictions).items()}


def teacher_forced(cfg: Config, model: Any, params: Any, task: Any, split: str) -> dict[str, float]:
  """Loss (nats/token, unsmoothed), accuracy and perplexity over eval.num_batches batches of split."""
  from transformer.training import make_eval_step  # pylint: disable=g-import-not-at-top
  step = jax.jit(make_eval_step(cfg, model))
  totals = {"loss_sum": 0.0, "weight_sum": 0.0, "correct_sum": 0.0}
  for i, batch in enumerate(task.eval_batches(split, batch_size=cfg.eval.batch_size or None)):
    if cfg.eval.num_batches and i >= cfg.eval.num_batches:
      break
    batch = {k: jnp.asarray(v) for k, v in batch.items() if v is not None}
    for k, v in jax.device_get(step(params, batch)).items():
      totals[k] += float(v)
  if not totals["weight_sum"]:
    raise EvaluationError(f"split {split!r} has no target tokens to evaluate")
  loss = totals["loss_sum"] / totals["weight_sum"]
  return {"loss": loss, "accuracy": totals["correct_sum"] / totals["weight_sum"],
          "perplexity": metrics_lib.perplexity(loss), "tokens": totals["weight_sum"]}


# ----------------------------------------------------------------------------- the entry point


def write_predictions(path: str, predictions: Sequence[dict[str, Any]]) -> None:
  """One JSON object per line: source, references, hypothesis, score."""
  files.write_text_atomic(path, "".join(json.dumps(p, ensure_ascii=False) + "\n"
                                        for p in predictions))


def format_table(results: dict[str, Any]) -> str:
  """A two-column text table of the scalar results."""
  rows = [(k, f"{v:.4f}" if isinstance(v, float) else str(v)) for k, v in results.items()
          if isinstance(v, (int, float, str))]
  width = max(len(k) for k, _ in rows)
  return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def evaluate(workdir: str, split: str = "test", step: int | str | None = None,
             overrides: dict[str, Any] | None = None, task: Any = None,
             verbose: bool = True) -> dict[str, Any]:
  """Evaluates a run's checkpoint on `split`; writes predictions/metrics files; returns the metrics.

  `task` overrides `transformer.data.load_task(cfg, workdir)` (tests); the tokenizers it loads are
  the ones saved in `<workdir>/tokenizers` by training.
  """
  from transformer.models import build_model  # pylint: disable=g-import-not-at-top
  cfg = load_config(workdir, overrides)
  if task is None:
    from transformer.data import load_task  # pylint: disable=g-import-not-at-top
    task = load_task(cfg, workdir)
  reporting.warn_if_data_differs(workdir, task, split)
  model = build_model(cfg.model)
  params, step = restore_params(cfg, workdir, step)
  results: dict[str, Any] = {"split": split, "step": step}
  results |= teacher_forced(cfg, model, params, task, split)
  names = metric_names(cfg, task)
  if getattr(task, "kind", "seq2seq") == "lm":
    unit = {"char": "char", "byte": "byte"}.get(getattr(task.target_tokenizer, "kind", ""), "token")
    if "bpc" in names:
      results[f"bits_per_{unit}"] = metrics_lib.bits_per_unit(results["loss"])
    predictions = sample_continuations(cfg, model, params, task, split)
  else:
    predictions = decode_split(cfg, model, params, task, split, cfg.eval.num_decode_examples)
    results |= prediction_metrics(names, predictions)
  results["decoded"] = len(predictions)
  results["decode"] = cfg.eval.decode.method + (
      f"(beam={cfg.eval.decode.beam_size}, alpha={cfg.eval.decode.length_penalty})"
      if cfg.eval.decode.method == "beam" else "")
  write_predictions(os.path.join(workdir, f"predictions.{split}.jsonl"), predictions)
  files.write_text_atomic(os.path.join(workdir, f"metrics.{split}.json"), json.dumps(
      {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
       for k, v in results.items()}, indent=1))
  if verbose:
    print(format_table(results))
    for p in predictions[:3] if getattr(task, "kind", "") == "lm" else []:
      print(f"--- {p['source']!r} -> {p['hypothesis']!r}")
  return results
