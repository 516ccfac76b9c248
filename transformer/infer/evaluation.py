"""Evaluation of a trained run: `evaluate_split` (eval.py's entry point) scores a split
teacher-forced, decodes it (seq2seq) or samples continuations (LMs), and writes
metrics.<split>.json and predictions.<split>.jsonl; `decode_metrics` is training's evaluation.
"""

import dataclasses
import itertools
import json
import math
import os
import re
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from transformer import files, metrics as metrics_lib
from transformer.config import Config, ConfigError, DecodeConfig
from transformer.data.tokenizers import NUM_SPECIAL
from transformer.infer.decoding import generate
from transformer.model import ensemble as ensemble_lib, scoring
from transformer.model.models import build_model
from transformer.run import guard, provenance, reporting
from transformer.run.restore import EvaluationError, load_run_config, read_params

Progress = Callable[[int, int], None]  # (done, in all; 0 when not known), called after each batch
WHOLE_SPLIT = {"eval.num_batches": 0, "eval.num_decode_examples": 0}  # evaluate_split's defaults
_STRESS = re.compile(r"\d")
NUM_LM_SAMPLES = 4  # continuations sampled for a language model
LM_PROMPT_LEN = 16  # tokens of each eval row used as an LM prompt


def source_ids(task: Any, text: str) -> list[int]:
  """The encoder input (or decoder-only prompt) ids of `text`, as the data pipeline builds them."""
  if hasattr(task, "encode_source"):
    return list(task.encode_source(text))
  if getattr(task, "kind", "seq2seq") == "lm" or task.source_tokenizer is None:
    return list(task.target_tokenizer.encode(text))
  return list(task.source_tokenizer.encode(text)) + [task.source_tokenizer.eos_id]


def decode_batches(cfg: Config, model: Any, params: Any, ids: Sequence[Sequence[int]],
                   decode_cfg: DecodeConfig | None = None, *, eos_id: int,
                   batch_size: int = 0, rng: jax.Array | None = None,
                   prefix_lm: bool | None = None, progress: Progress | None = None,
                   start_token: bool = True, width: int = 0
                   ) -> tuple[list[list[int]], list[float]]:
  """(token lists up to EOS, scores) of encoder inputs or prompts, in batches of one shape (at
  least `width` wide); `progress(done, total)` is called before the first batch and after each;
  start_token: as generate's."""
  if not ids:
    return [], []
  decode_cfg = decode_cfg or cfg.eval.decode
  b = batch_size or min(cfg.eval.batch_size or cfg.data.batch_size, 64)
  key = "inputs" if cfg.model.arch == "encoder_decoder" else "prompt"
  width = max(*map(len, ids), 1, width, cfg.data.max_source_len if key == "inputs" else 0)
  max_decode_len = decode_cfg.max_decode_len or cfg.data.max_target_len
  if key == "prompt" and not decode_cfg.max_decode_len:
    # The prompt and its continuation share the model.max_len cache: by default decode what fits.
    max_len = min(m.config.max_len for m in ensemble_lib.members(model, params)[0])
    max_decode_len = min(max_decode_len, max_len - width)
    if max_decode_len < 1:
      raise EvaluationError(f"a prompt of {width} tokens leaves no room to decode within "
                            f"model.max_len={max_len}")
  tokens_out, scores_out = [], []
  if progress is not None:
    progress(0, len(ids))
  for start in range(0, len(ids), b):
    chunk = list(ids[start:start + b])
    array = np.zeros((b, width), np.int32)
    for r, row in enumerate(chunk + [chunk[0]] * (b - len(chunk))):
      array[r, :len(row)] = row
    sub = None if rng is None else jax.random.fold_in(rng, start)
    tokens, scores = generate(model, params, {key: jnp.asarray(array)}, decode_cfg, eos_id=eos_id,
                              max_decode_len=max_decode_len, rng=sub, prefix_lm=prefix_lm,
                              start_token=start_token)
    for row, score in zip(np.asarray(tokens)[:len(chunk)].tolist(), np.asarray(scores)):
      tokens_out.append(row[:row.index(eos_id)] if eos_id in row else [t for t in row if t])
      scores_out.append(float(score))
    if progress is not None:
      progress(len(tokens_out), len(ids))
  return tokens_out, scores_out


def decode_split(cfg: Config, model: Any, params: Any, task: Any, split: str,
                 num_examples: int = 0, progress: Progress | None = None
                 ) -> list[dict[str, Any]]:
  """Decodes (the first `num_examples` of) a seq2seq split into prediction records; `progress`
  as decode_batches'."""
  examples = list(task.eval_examples(split))[:num_examples or None]
  tok = task.target_tokenizer
  ids = [source_ids(task, e["source"]) for e in examples]
  tokens, scores = decode_batches(cfg, model, params, ids, eos_id=tok.eos_id,
                                  rng=jax.random.key(cfg.seed), progress=progress)
  return [dict(source=e["source"], references=list(e["references"]), hypothesis=tok.decode(t),
               score=s) for e, t, s in zip(examples, tokens, scores)]


def sample_continuations(cfg: Config, model: Any, params: Any, task: Any, split: str
                         ) -> list[dict[str, Any]]:
  """LM: prompts from the first eval rows, continued with eval.decode (prediction records)."""
  tok = task.target_tokenizer
  rows = ([int(t) for t in row if t] for batch in task.eval_batches(split)
          for row in np.asarray(batch["targets"]))
  kept = list(itertools.islice((r for r in rows if len(r) > LM_PROMPT_LEN), NUM_LM_SAMPLES))
  prompts, truths = [r[:LM_PROMPT_LEN] for r in kept], [r[LM_PROMPT_LEN:] for r in kept]
  decode_cfg = dataclasses.replace(cfg.eval.decode, max_decode_len=min(
      cfg.eval.decode.max_decode_len or 64, cfg.model.max_len - LM_PROMPT_LEN))
  tokens, scores = decode_batches(cfg, model, params, prompts, decode_cfg, eos_id=tok.eos_id,
                                  batch_size=len(prompts) or 1, rng=jax.random.key(cfg.seed),
                                  prefix_lm=False)
  return [dict(source=tok.decode(p), references=[tok.decode(t[:len(h)])], hypothesis=tok.decode(h),
               score=s) for p, t, h, s in zip(prompts, truths, tokens, scores)]


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
  names, out = set(names), {}
  hyps = [p["hypothesis"] for p in predictions]
  refs = [p["references"] for p in predictions]
  if predictions and names & {"wer", "per"}:
    tracks = {"": strip_stress}
    if any(_STRESS.search(r) for rs in refs for r in rs):
      tracks["_stress"] = str
    for suffix, clean in tracks.items():
      wer, per = metrics_lib.wer_per([clean(h).split() for h in hyps],
                                     [[clean(r).split() for r in rs] for rs in refs])
      out.update({k + suffix: v for k, v in (("wer", wer), ("per", per)) if k in names})
  if predictions and "bleu" in names:
    bleu_refs = refs if len({len(rs) for rs in refs}) == 1 else [rs[0] for rs in refs]
    out["bleu"] = metrics_lib.bleu(hyps, bleu_refs)
  return out


def decode_metrics(cfg: Config, model: Any, params: Any, task: Any, split: str,
                   num_examples: int = 0, progress: Progress | None = None) -> dict[str, float]:
  """Task metrics from decoding `split`, and how many examples they cover; {} for LMs.
  `progress(done, total)`: as decode_batches'."""
  if getattr(task, "kind", "seq2seq") == "lm" or not getattr(task, "decodes", True):
    return {}
  predictions = decode_split(cfg, model, params, task, split, num_examples, progress)
  out = prediction_metrics(metric_names(cfg, task), predictions)
  return {"eval/" + k: v for k, v in (out | {"decoded_examples": len(predictions)}).items()}


def teacher_forced(cfg: Config, model: Any, params: Any, task: Any, split: str,
                   progress: Progress | None = None) -> tuple[dict[str, float], dict[str, int]]:
  """Loss, accuracy, perplexity over eval.num_batches of `split` (0 = all), and their coverage;
  `progress(batches done, 0)` after each batch."""
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
    if progress is not None:
      progress(i + 1, 0)
  if not totals["weight_sum"]:
    raise EvaluationError(f"split {split!r} has no target tokens to evaluate")
  scores = scoring.teacher_forced_metrics(totals)
  del scores["scored_tokens"]  # reported in the coverage, next to the split's size
  if "confusion" in totals:  # rows: the reference class, columns: the predicted one
    scores["confusion_matrix"] = class_confusion(np.rint(totals["confusion"]).astype(int).tolist(),
                                                 task.target_tokenizer)
    scores["classes"] = list(scores["confusion_matrix"]["classes"])
  return scores, {"scored_tokens": round(totals["weight_sum"]), "split_tokens": round(split_tokens)}


def class_confusion(counts: Sequence[Sequence[int]], tokenizer: Any) -> dict[str, Any]:
  """The confusion matrix over a label tokenizer's ordinary ids (its classes): {'classes',
  'counts' [reference][predicted]}; predictions of a special id (never the argmax of a trained
  head) are left out."""
  size = tokenizer.vocab_size
  classes = [tokenizer.decode([i]) for i in range(NUM_SPECIAL, size)]
  return {"classes": classes,
          "counts": [list(row[NUM_SPECIAL:size]) for row in counts[NUM_SPECIAL:size]]}


def format_confusion(confusion: dict[str, Any]) -> str:
  """A text table of a confusion matrix: a row per reference class, a column per prediction."""
  classes, counts = confusion["classes"], confusion["counts"]
  width = max([len(c) for c in classes] + [len(str(v)) for row in counts for v in row] + [3])
  head = " " * width + " " + " ".join(f"{c:>{width}}" for c in classes)
  lines = ["confusion matrix (rows: reference, columns: predicted)", head]
  lines += [f"{c:>{width}} " + " ".join(f"{v:>{width}}" for v in row)
            for c, row in zip(classes, counts)]
  return "\n".join(lines)


def write_results(workdir: str, split: str, results: dict[str, Any],
                  predictions: Sequence[dict[str, Any]]) -> bool:
  """Process 0 writes `metrics.<split>.json` and `predictions.<split>.jsonl`; True if it did."""
  if jax.process_index() != 0:  # every host evaluates the same whole split: one writer
    return False
  metrics_name, predictions_name = result_files(split)
  guard.write_bytes(workdir, predictions_name, "".join(
      json.dumps(p, ensure_ascii=False) + "\n" for p in predictions).encode("utf-8"))
  finite = lambda v: None if isinstance(v, float) and not math.isfinite(v) else v  # noqa: E731
  guard.write_bytes(workdir, metrics_name, json.dumps(
      {k: finite(v) for k, v in results.items()}, indent=1).encode("utf-8"))
  return True


def result_files(split: str) -> tuple[str, str]:
  """The names of the metrics and predictions files that write_results writes for `split`."""
  return f"metrics.{split}.json", f"predictions.{split}.jsonl"


def format_table(results: dict[str, Any], scored: str = "tokens") -> str:
  """A two-column text table of the scalar results, then how much of the split they cover
  (`scored`: what the scored units are, e.g. a classifier's examples)."""
  rows = [(k, f"{v:.4f}" if isinstance(v, float) else str(v)) for k, v in results.items()
          if isinstance(v, (int, float, str))]
  rows += [(k, ", ".join(map(str, v))) for k, v in results.items() if isinstance(v, list)]
  cov = results.get("coverage", {})
  for what, unit, shown in (("decoded", "examples", "examples"), ("scored", "tokens", scored)):
    done, total = f"{what}_{unit}", f"split_{unit}"
    if done in cov:
      whole = "the whole split" if cov[done] == cov[total] else (
          f"{cov[done] / max(cov[total], 1):.1%} of the split: a partial evaluation")
      rows.append((what, f"{cov[done]} of {cov[total]} {shown} ({whole})"))
  width = max(len(k) for k, _ in rows)
  return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _same_vocabularies(workdir: str, member: str) -> None:
  """Raises EvaluationError unless `member` saved the same tokenizers as `workdir`."""
  from transformer.data import tokenizers  # pylint: disable=g-import-not-at-top  (TFDS)
  for side in ("source", "target"):
    mine, theirs = (os.path.join(d, "tokenizers", side) for d in (workdir, member))
    exists = [files.exists(os.path.join(d, "tokenizer.json")) for d in (mine, theirs)]
    if not any(exists):
      continue  # e.g. no source tokenizer: a language model
    if not all(exists):
      raise EvaluationError(f"{theirs if exists[0] else mine}/tokenizer.json not found: an "
                            "ensemble needs every member's tokenizers")
    if tokenizers.load(mine) != tokenizers.load(theirs):
      raise EvaluationError(f"ensemble member {member}: its {side} vocabulary (tokenizers/{side}) "
                            f"differs from {workdir}'s; the members of an ensemble must share the "
                            "vocabularies")


def read_members(workdirs: Sequence[str], overrides: dict[str, Any], step: int | str | None,
                 params: str, average_last: int) -> tuple[list[Config], list[Any]]:
  """The configs and read_params results of `workdirs` (a run, then its ensemble), checked first."""
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


def _console_progress(split: str, verbose: bool
                      ) -> tuple[reporting.TaskProgress, reporting.TaskProgress]:
  """evaluate_split's progress on stderr: scoring the split's batches, then decoding (silent
  unless `verbose`)."""
  return (reporting.TaskProgress(lambda _: f"evaluating (scoring the {split} split)", "batches",
                                 enabled=verbose),
          reporting.TaskProgress(lambda n: f"evaluating (decoding {n} examples)", "examples",
                                 enabled=verbose))


def evaluate_split(workdir: str, split: str = "test", step: int | str | None = None,
             overrides: dict[str, Any] | None = None, task: Any = None,
             verbose: bool = True, params: str = "auto", average_last: int = 0,
             ensemble: Sequence[str] = (), out_dir: str | None = None) -> dict[str, Any]:
  """Evaluates a run's checkpoint on `split`, writes the files and returns the metrics. `params`,
  `average_last`: as read_params; `ensemble`: more runs, evaluated with this one into `out_dir`."""
  workdirs = [workdir, *ensemble]
  _check_out_dir(workdirs, out_dir, split)
  configs, restored = read_members(workdirs, WHOLE_SPLIT | (overrides or {}), step, params,
                                   average_last)
  files.check_writable(out_dir or workdir)  # before the split is evaluated, not after
  cfg = configs[0]
  model = tuple(build_model(c.model) for c in configs)  # one run: a 1-tuple, a one-member ensemble
  params = tuple(r.params for r in restored)
  if task is None:
    from transformer.data import load_task  # pylint: disable=g-import-not-at-top  (TFDS)
    task = load_task(cfg, workdir, process_index=0, process_count=1)  # the whole split, each host
  provenance.check_split_data(workdir, task, split)
  results = _checkpoint_fields(split, workdirs, restored, average_last)
  scoring_progress, decoding_progress = _console_progress(split, verbose)
  scores, coverage = teacher_forced(cfg, model, params, task, split, scoring_progress)
  scoring_progress.close()
  results |= scores
  names = metric_names(cfg, task)
  if cfg.model.arch == "encoder_only" or cfg.data.objective != "none":
    # The teacher-forced metrics (accuracy, perplexity, F1, span corruption's loss) are the task's.
    predictions = []
  elif getattr(task, "kind", "seq2seq") == "lm":
    unit = {"char": "char", "byte": "byte"}.get(getattr(task.target_tokenizer, "kind", ""), "token")
    if "bpc" in names:
      results[f"bits_per_{unit}"] = metrics_lib.bits_per_unit(results["loss"])
    predictions = sample_continuations(cfg, model, params, task, split)
  else:
    predictions = decode_split(cfg, model, params, task, split, cfg.eval.num_decode_examples,
                               decoding_progress)
    decoding_progress.close()
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
    scored = "examples" if cfg.model.head == "classify" and cfg.model.arch == "encoder_only" \
        else "tokens"  # a classifier scores one label per example (image)
    _print_results(results, predictions if getattr(task, "kind", "") == "lm" else [],
                   out_dir or workdir if wrote else None, split, scored)
  return results


def _check_out_dir(workdirs: Sequence[str], out_dir: str | None, split: str) -> None:
  """EvaluationError unless the results' directory is one an evaluation of `workdirs` may write
  (guard.check: the run's own workdir, or a directory outside every run whose files of `split`'s
  names the evaluation wrote itself): an ensemble's own new directory, never another run's."""
  workdir, ensemble = workdirs[0], workdirs[1:]
  if ensemble and not out_dir:
    raise EvaluationError("an ensemble's metrics need their own directory: give --out")
  if out_dir and ensemble and os.path.normpath(out_dir) in map(os.path.normpath, workdirs):
    raise EvaluationError(f"--out={out_dir} is one of the ensemble's runs: give a new directory")
  if (out_dir and os.path.normpath(out_dir) != os.path.normpath(workdir)
      and files.exists(os.path.join(out_dir, "config.json"))):  # its metrics would be replaced
    raise EvaluationError(f"--out={out_dir} holds another run (its config.json): give a new "
                          "directory")
  if out_dir:
    try:
      guard.check(out_dir, "--out", result_files(split), own=None if ensemble else workdir)
    except guard.WriteRefused as e:
      raise EvaluationError(str(e)) from None


def _checkpoint_fields(split: str, workdirs: Sequence[str], restored: Sequence[Any],
                       average_last: int) -> dict[str, Any]:
  """What the results say of the parameters evaluated: the first run's step and source (and
  averaged steps), and with an ensemble each member's."""
  results: dict[str, Any] = {"split": split, "step": restored[0].step,
                             "params": restored[0].source}
  if average_last:
    results["averaged_steps"] = list(restored[0].steps)
  if len(workdirs) > 1:  # each member's own: the fields above are the first run's
    results |= {"ensemble": list(workdirs), "ensemble_steps": [r.step for r in restored],
                "ensemble_params": [r.source for r in restored]}
    if average_last:
      results["ensemble_averaged_steps"] = [list(r.steps) for r in restored]
  return results


def _print_results(results: dict[str, Any], samples: Sequence[dict[str, Any]],
                   written_to: str | None, split: str, scored: str = "tokens") -> None:
  """The results table, the confusion matrix, an LM's first samples and the files written."""
  print(format_table(results, scored))
  if "confusion_matrix" in results:
    print(format_confusion(results["confusion_matrix"]))
  for p in samples[:3]:
    print(f"--- {p['source']!r} -> {p['hypothesis']!r}")
  if written_to:
    print("wrote " + ", ".join(os.path.join(written_to, name) for name in result_files(split)))
