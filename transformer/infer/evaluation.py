"""Evaluation of a trained run: restore, teacher-forced metrics, decoding, task metrics, predictions.

`evaluate_split(workdir, split, step, overrides, ...)`, which eval.py calls:
  1. `read_members` reads each run's config.json (restore.load_run_config applies `overrides`,
     a flat {"eval.decode.beam_size": 4} dict, and refuses keys outside the schema's `eval` role)
     and restores the parameters of `step` read-only onto one device (restore.read_params:
     the EMA or the raw ones, or the mean of the newest `average_last` checkpoints);
  2. `teacher_forced`: loss, token accuracy and perplexity (scoring.teacher_forced_metrics, the
     definition training logs);
  3. seq2seq tasks: `decode_split` decodes with `eval.decode` (batched `generate`) and
     `prediction_metrics` scores the hypotheses; language models: `sample_continuations`;
     encoder-only and objective tasks: the teacher-forced metrics are the task's;
  4. `write_results` (process 0) writes metrics.<split>.json and predictions.<split>.jsonl;
     `format_table` is the printed table.
WHOLE_SPLIT is applied under `overrides`: the run's in-training (partial) `eval.num_batches` /
`eval.num_decode_examples` do not carry over, and `coverage` in the results says how much of the
split was scored and decoded. With `ensemble`, steps 1-3 use every run's parameters and the mean
of their probabilities (transformer.model.ensemble); the files go to `out_dir`. Every process evaluates
the whole split on its first local device.

Task metrics (`metric_names`: `eval.metrics`, "auto" or a comma list):
  wer, per    G2P: a word is right if its hypothesis equals any reference; PER takes the closest
              reference (transformer.metrics.wer_per), on the no-stress track (`strip_stress`);
              when the references carry stress, also `wer_stress`, `per_stress` as written.
  bleu        corpus BLEU (sacrebleu 13a) of the detokenised hypotheses.
  bpc         LM: bits per token, named bits_per_char / bits_per_byte for char / byte tokenizers.
"auto" is wer,per for seq2seq tasks whose target tokenizer is `symbol` (phones), bleu for other
seq2seq tasks and bpc for language models.
`decode_metrics` is what the training loop calls for its in-training evaluations; it logs
`eval/decoded_examples`, so a partial in-training evaluation says that it is partial.
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
import numpy as np

from transformer import files, metrics as metrics_lib
from transformer.config import Config, ConfigError, DecodeConfig
from transformer.infer.decoding import generate
from transformer.model import ensemble as ensemble_lib, scoring
from transformer.model.models import build_model
from transformer.run import provenance
from transformer.run.restore import EvaluationError, load_run_config, read_params

WHOLE_SPLIT = {"eval.num_batches": 0, "eval.num_decode_examples": 0}  # evaluate_split's defaults
_STRESS = re.compile(r"\d")
NUM_LM_SAMPLES = 4  # continuations sampled for a language model
LM_PROMPT_LEN = 16  # tokens of each eval row used as an LM prompt


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
  `model`/`params`: one model, or an ensemble's tuples (transformer.model.ensemble; `cfg` is the first's).

  Encoder-decoder: the ids are the encoder inputs; decoder-only: the prompts, attended
  bidirectionally when `prefix_lm` (None = model.prefix_lm; language models pass False, as they
  were trained without a prefix).
  The last batch is filled with copies of its first row so every batch compiles to one program.
  """
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
    max_len = min(m.config.max_len for m in ensemble_lib.members(model, params)[0])
    max_decode_len = min(max_decode_len, max_len - width)
    if max_decode_len < 1:
      raise EvaluationError(f"a prompt of {width} tokens leaves no room to decode within "
                            f"model.max_len={max_len}")
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
  """Task metrics (WER/PER or BLEU) from decoding `split`, and `decoded_examples`; {} for LMs.

  The training loop's in-training evaluation calls this with the eval split and its (partial)
  eval.num_decode_examples; the logged count says how many examples the metrics cover.
  """
  if getattr(task, "kind", "seq2seq") == "lm" or not getattr(task, "decodes", True):
    return {}
  predictions = decode_split(cfg, model, params, task, split, num_examples)
  out = prediction_metrics(metric_names(cfg, task), predictions)
  return {prefix + k: v for k, v in (out | {"decoded_examples": len(predictions)}).items()}


def teacher_forced(cfg: Config, model: Any, params: Any, task: Any, split: str
                   ) -> tuple[dict[str, float], dict[str, int]]:
  """Loss (nats/token, unsmoothed), accuracy and perplexity over eval.num_batches batches of split
  (0 = all), and the coverage {scored_tokens, split_tokens}."""
  step = jax.jit(scoring.make_eval_step(model))
  totals = {"loss_sum": 0.0, "weight_sum": 0.0, "correct_sum": 0.0}
  split_tokens = 0.0
  for i, batch in enumerate(task.eval_batches(split, batch_size=cfg.eval.batch_size or None)):
    batch = {k: jnp.asarray(v) for k, v in batch.items() if v is not None}
    split_tokens += float(jnp.sum(scoring.target_weights(batch)))  # every batch: the split's size
    if cfg.eval.num_batches and i >= cfg.eval.num_batches:
      continue
    for k, v in jax.device_get(step(params, batch)).items():  # per-class counts are arrays
      totals[k] = totals.get(k, 0.0) + np.asarray(v, np.float64)
  if not totals["weight_sum"]:
    raise EvaluationError(f"split {split!r} has no target tokens to evaluate")
  scores = scoring.teacher_forced_metrics(totals)
  del scores["scored_tokens"]  # reported in the coverage, next to the split's size
  return scores, {"scored_tokens": round(totals["weight_sum"]), "split_tokens": round(split_tokens)}


# ----------------------------------------------------------------------------- the entry point


def write_results(workdir: str, split: str, results: dict[str, Any],
                  predictions: Sequence[dict[str, Any]]) -> bool:
  """Process 0 writes `metrics.<split>.json` and `predictions.<split>.jsonl` (one JSON object per
  line: source, references, hypothesis, score); True if this process wrote them."""
  if jax.process_index() != 0:  # every host evaluates the same whole split: one writer
    return False
  metrics_name, predictions_name = result_files(split)
  files.makedirs(workdir)
  files.write_text_atomic(os.path.join(workdir, predictions_name), "".join(
      json.dumps(p, ensure_ascii=False) + "\n" for p in predictions))
  finite = lambda v: None if isinstance(v, float) and not math.isfinite(v) else v  # noqa: E731
  files.write_text_atomic(os.path.join(workdir, metrics_name), json.dumps(
      {k: finite(v) for k, v in results.items()}, indent=1))
  return True


def result_files(split: str) -> tuple[str, str]:
  """The names of the metrics and predictions files that write_results writes for `split`."""
  return f"metrics.{split}.json", f"predictions.{split}.jsonl"


def format_table(results: dict[str, Any]) -> str:
  """A two-column text table of the scalar results, then how much of the split they cover."""
  rows = [(k, f"{v:.4f}" if isinstance(v, float) else str(v)) for k, v in results.items()
          if isinstance(v, (int, float, str))]
  rows += [(k, ", ".join(map(str, v))) for k, v in results.items() if isinstance(v, list)]
  cov = results.get("coverage", {})
  for what, done, total in (("decoded", "decoded_examples", "split_examples"),
                            ("scored", "scored_tokens", "split_tokens")):
    if done in cov:
      unit = "examples" if what == "decoded" else "tokens"
      whole = "the whole split" if cov[done] == cov[total] else (
          f"{cov[done] / max(cov[total], 1):.1%} of the split: a partial evaluation")
      rows.append((what, f"{cov[done]} of {cov[total]} {unit} ({whole})"))
  width = max(len(k) for k, _ in rows)
  return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _same_vocabularies(workdir: str, member: str) -> None:
  """Raises EvaluationError unless `member` saved the same tokenizers as `workdir` (equal as
  tokenizers: units, SentencePiece model or Hugging Face tokenizer)."""
  from transformer.data import tokenizers  # pylint: disable=g-import-not-at-top  (TFDS)
  for side in ("source", "target"):
    mine, theirs = (os.path.join(d, "tokenizers", side) for d in (workdir, member))
    exists = [files.exists(os.path.join(d, "tokenizer.json")) for d in (mine, theirs)]
    if not any(exists):
      continue  # e.g. no source tokenizer: a language model
    if not all(exists):
      missing = theirs if exists[0] else mine
      raise EvaluationError(f"{missing}/tokenizer.json not found: an ensemble needs every "
                            "member's tokenizers")
    if tokenizers.load(mine) != tokenizers.load(theirs):
      raise EvaluationError(f"ensemble member {member}: its {side} vocabulary (tokenizers/{side}) "
                            f"differs from {workdir}'s; the members of an ensemble must share the "
                            "vocabularies")


def read_members(workdirs: Sequence[str], overrides: dict[str, Any], step: int | str | None,
                 params: str, average_last: int) -> tuple[list[Config], list[Any]]:
  """The configs and `restore.read_params` results of the runs in `workdirs` (the first gives
  the data and settings; the others are its ensemble), each at the same `step` / `params` /
  `average_last` choice ('best': each run's own best checkpoint). Every run's config, vocabulary
  and model are checked before any parameters are read."""
  configs = []
  for i, workdir in enumerate(workdirs):
    if os.path.normpath(workdir) in map(os.path.normpath, workdirs[:i]):
      raise EvaluationError(f"ensemble member {workdir} is given twice")
    configs.append(load_run_config(workdir, overrides))
    if i:
      _same_vocabularies(workdirs[0], workdir)
  try:
    ensemble_lib.check_compatible([c.model for c in configs], workdirs)
  except ValueError as e:
    raise EvaluationError(str(e)) from None
  return configs, [read_params(c, w, step, params=params, average_last=average_last)
                   for c, w in zip(configs, workdirs)]


def evaluate_split(workdir: str, split: str = "test", step: int | str | None = None,
             overrides: dict[str, Any] | None = None, task: Any = None,
             verbose: bool = True, params: str = "auto", average_last: int = 0,
             ensemble: Sequence[str] = (), out_dir: str | None = None) -> dict[str, Any]:
  """Evaluates a run's checkpoint on the whole `split` (unless `overrides` set eval.num_batches /
  eval.num_decode_examples); process 0 writes the predictions and metrics files; returns the
  metrics, with `coverage` = {decoded_examples, split_examples, scored_tokens, split_tokens}.

  `params` ('auto': the EMA if the run kept one, 'ema', 'raw') and `average_last` (the mean over
  the N newest checkpoints; 0 = one checkpoint) choose the parameters (restore.read_params).

  `ensemble`: the workdirs of further runs (same vocabularies) evaluated with this one as one model,
  the mean of their probabilities (transformer.model.ensemble), each at the same step/params choice;
  the run in `workdir` gives the data, metrics and decoding settings. Its files go to `out_dir`
  (required then, so that no run's own metrics are overwritten; default for one run: `workdir`).

  `task` overrides `transformer.data.load_task(cfg, workdir)` (tests); the tokenizers it loads are
  the ones saved in `<workdir>/tokenizers` by training.
  """
  workdirs = [workdir, *ensemble]
  if ensemble and not out_dir:
    raise EvaluationError("an ensemble's metrics need their own directory: give --out")
  if out_dir and ensemble and os.path.normpath(out_dir) in map(os.path.normpath, workdirs):
    raise EvaluationError(f"--out={out_dir} is one of the ensemble's runs: give a new directory")
  configs, restored = read_members(workdirs, WHOLE_SPLIT | (overrides or {}), step, params,
                                   average_last)
  files.check_writable(out_dir or workdir)  # before the split is evaluated, not after
  cfg = configs[0]
  model = tuple(build_model(c.model) for c in configs)  # one run: a 1-tuple, a one-member ensemble
  params = tuple(r.params for r in restored)
  step = restored[0].step
  if task is None:
    from transformer.data import load_task  # pylint: disable=g-import-not-at-top  (TFDS)
    task = load_task(cfg, workdir, process_index=0, process_count=1)  # the whole split, each host
  provenance.warn_if_data_differs(workdir, task, split)
  results: dict[str, Any] = {"split": split, "step": step, "params": restored[0].source}
  if average_last:
    results["averaged_steps"] = list(restored[0].steps)
  if ensemble:  # each member's own: the fields above are the first run's
    results["ensemble"] = workdirs
    results["ensemble_steps"] = [r.step for r in restored]
    results["ensemble_params"] = [r.source for r in restored]
    if average_last:
      results["ensemble_averaged_steps"] = [list(r.steps) for r in restored]
  scores, coverage = teacher_forced(cfg, model, params, task, split)
  results |= scores
  names = metric_names(cfg, task)
  if cfg.model.arch == "encoder_only" or cfg.data.objective != "none":
    # The teacher-forced metrics are the task's: masked-token or label accuracy and perplexity,
    # F1 (classify, tag); span corruption's loss over the spans.
    predictions = []
  elif getattr(task, "kind", "seq2seq") == "lm":
    unit = {"char": "char", "byte": "byte"}.get(getattr(task.target_tokenizer, "kind", ""), "token")
    if "bpc" in names:
      results[f"bits_per_{unit}"] = metrics_lib.bits_per_unit(results["loss"])
    predictions = sample_continuations(cfg, model, params, task, split)
  else:
    predictions = decode_split(cfg, model, params, task, split, cfg.eval.num_decode_examples)
    results |= prediction_metrics(names, predictions)
    coverage = {"decoded_examples": len(predictions),
                "split_examples": len(task.eval_examples(split))} | coverage
  if predictions or getattr(task, "decodes", True):
    results["decode"] = cfg.eval.decode.method + (
        f"(beam={cfg.eval.decode.beam_size}, alpha={cfg.eval.decode.length_penalty})"
        if cfg.eval.decode.method == "beam" else "")
  results["coverage"] = coverage
  wrote = write_results(out_dir or workdir, split, results, predictions)
  if verbose:
    print(format_table(results))
    for p in predictions[:3] if getattr(task, "kind", "") == "lm" else []:
      print(f"--- {p['source']!r} -> {p['hypothesis']!r}")
    if wrote:
      print("wrote " + ", ".join(os.path.join(out_dir or workdir, name)
                                 for name in result_files(split)))
  return results
