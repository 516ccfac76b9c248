"""The harness on runs of ours: a tiny char LM logs harness metrics as it trains
(eval.harness_tasks), `eval.py --harness_tasks` gives the same numbers from its checkpoint and
writes metrics.harness.json (which `compare` shows as columns), and RunLM's log-likelihoods
equal an independent teacher-forced pass of the model (batch_logits: the start token first, as
training's shift right), for a causal LM, an encoder-decoder and a prefix-LM.
"""

import json
import math
import os
import subprocess
import sys
import types

import jax
import numpy as np
import pytest

os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")  # before `datasets` is imported
pytest.importorskip("lm_eval")

import transformer  # noqa: E402
from configs import lm  # noqa: E402
from transformer.run import results  # noqa: E402
from transformer.infer.harness import tasks as harness  # noqa: E402
from transformer.model import models  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TASKS_DIR = os.path.join(HERE, "harness_tasks")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """The workdir of a tiny char LM (30 steps) that runs tiny_choice and tiny_text at steps 15
  and 30 (eval.every_steps=15, eval.harness_every_steps=15)."""
  tmp = tmp_path_factory.mktemp("harness_lm")
  lines = [json.loads(line)["text"] for line in open(os.path.join(TASKS_DIR, "data", "text.jsonl"))]
  (tmp / "corpus.txt").write_text("\n".join(lines * 4), encoding="utf-8")
  cd = lm.get_config("char")
  cd.model.update(d_model=32, num_heads=2, mlp_dim=64, num_decoder_layers=2, dropout_rate=0.0,
                  max_len=64)
  cd.data.update(dataset="text_files", text_file=str(tmp / "corpus.txt"),
                 data_dir=str(tmp / "tfds"), max_target_len=64, max_source_len=64, batch_size=8)
  cd.train.update(num_steps=30, learning_rate=3e-3, warmup_steps=5, log_every_steps=15)
  cd.eval.update(every_steps=15, num_batches=1, harness_tasks="tiny_choice,tiny_text",
                 harness_every_steps=15, harness_include_path=TASKS_DIR)
  cd.checkpoint.update(every_steps=30)
  workdir = str(tmp / "run")
  transformer.train_and_evaluate(cd, workdir)
  return workdir


def logged(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_training_logs_harness_metrics(trained):
  """Both evaluations log every task's metrics under eval/harness/, finite and in range."""
  evals = [r for r in logged(trained) if "eval/harness/tiny_choice/acc" in r]
  assert [r["step"] for r in evals] == [15, 30]
  for r in evals:
    assert 0.0 <= r["eval/harness/tiny_choice/acc"] <= 1.0
    assert math.isfinite(r["eval/harness/tiny_text/bits_per_byte"])
  assert evals[1]["eval/harness/tiny_text/bits_per_byte"] < evals[0][
      "eval/harness/tiny_text/bits_per_byte"]  # it learns the text it is scored on


def test_eval_py_gives_the_logged_numbers_and_compare_shows_them(trained):
  """`eval.py --harness_tasks` on the last checkpoint: the step-30 numbers training logged, the
  harness's table on stdout, metrics.harness.json written, harness/<task>/<metric> columns."""
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  done = subprocess.run(
      [sys.executable, "eval.py", f"--workdir={trained}", "--harness_tasks=tiny_choice,tiny_text",
       f"--harness_include_path={TASKS_DIR}"], cwd=REPO, env=env, capture_output=True, text=True,
      timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "|tiny_choice|" in done.stdout and "metrics.harness.json" in done.stdout
  with open(os.path.join(trained, harness.RESULTS_FILE)) as f:
    written = json.load(f)
  last = [r for r in logged(trained) if "eval/harness/tiny_choice/acc" in r][-1]
  for key in ("tiny_choice/acc", "tiny_choice/acc_norm", "tiny_text/bits_per_byte"):
    assert written[key] == pytest.approx(last[f"eval/harness/{key}"], abs=1e-6)
  row = results.split_metrics(results.read_run(trained))
  assert row["harness/tiny_choice/acc"] == written["tiny_choice/acc"]


def test_loglikelihood_equals_a_teacher_forced_pass(trained):
  """A run of ours: log p(continuation | context) is the model's teacher-forced log-probability
  of the continuation's tokens after the start token and the context (batch_logits shifts the
  targets right itself), and an empty context is the start token alone."""
  run = transformer.restore(trained)
  lm_ = harness.lm_of(run)
  pairs = [("the cat sees", " the moon."), ("", "she likes it."), ("a dog", " eats some fish.")]
  from lm_eval.api.instance import Instance
  got = lm_.loglikelihood([Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)],
                          disable_tqdm=True)
  tok = run.target_tokenizer
  assert len(got) == len(pairs)
  for (context, continuation), (logp, _) in zip(pairs, got):
    ids = tok.encode(context + continuation)
    n = len(tok.encode(continuation)) if not context else len(ids) - len(tok.encode(context))
    logits = models.batch_logits(run.model, run.params, {"targets": np.asarray([ids])})
    log_probs = np.asarray(jax.nn.log_softmax(logits[0], axis=-1))
    want = sum(log_probs[i, ids[i]] for i in range(len(ids) - n, len(ids)))
    assert logp == pytest.approx(float(want), abs=1e-4)


def test_an_encoder_only_run_is_one_line():
  from transformer.infer.harness.lm import RunLM
  from transformer.run.restore import EvaluationError
  config = types.SimpleNamespace(model=types.SimpleNamespace(arch="encoder_only"))
  with pytest.raises(EvaluationError, match=r"^the harness scores text with a decoder: this run "
                     r"is model.arch='encoder_only'"):
    RunLM(config, None, None, None, None)


def _loglikelihoods(lm_, pairs):
  """RunLM's (log-likelihood, greedy) of each (context, continuation): one answer per pair."""
  from lm_eval.api.instance import Instance
  got = lm_.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)],
                          disable_tqdm=True)
  assert len(got) == len(pairs)
  return got


def _summed(logits, targets, n):
  """log p of the last n of `targets` [t] under logits [t, v]."""
  log_probs = np.asarray(jax.nn.log_softmax(np.asarray(logits), axis=-1))
  return float(sum(log_probs[i, targets[i]] for i in range(len(targets) - n, len(targets))))


def test_an_encoder_decoder_scores_the_context_in_its_encoder():
  """A seq2seq run of ours (a random tiny encoder-decoder, its own source and target
  vocabularies): the context's source ids + EOS go into the encoder, the continuation is the
  decoder's target, as the harness's seq2seq path does; an empty context is EOS alone."""
  from decoding_fixtures import _tiny_model
  from transformer.data.tokenizers import CharTokenizer, EOS_ID
  from transformer.infer.harness.lm import RunLM
  model, params, _ = _tiny_model("encoder_decoder")
  source, target = CharTokenizer(list("abcdefg")), CharTokenizer(list("rstuvwxyz"))
  lm_ = RunLM(types.SimpleNamespace(model=model.config), model, params, source, target,
              kind="seq2seq")
  pairs = [("abc", "xyz"), ("gfedcba", "rst"), ("", "uvw")]
  for (context, continuation), (logp, _) in zip(pairs, _loglikelihoods(lm_, pairs)):
    inputs = (source.encode(context) + [EOS_ID]) if context else [EOS_ID]
    targets = target.encode(continuation)
    logits = models.batch_logits(model, params, {"inputs": np.asarray([inputs]),
                                                 "targets": np.asarray([targets])})[0]
    assert logp == pytest.approx(_summed(logits, targets, len(targets)), abs=1e-4)


def test_a_prefix_lm_reads_the_context_bidirectionally():
  """A prefix-LM trained on pairs (task kind seq2seq): the start token and the context are its
  bidirectional prefix (the model's own prefix_mask pass); trained on plain text (kind 'lm') it
  is causal throughout, and the two differ."""
  from decoding_fixtures import _tiny_model
  from transformer.data.tokenizers import CharTokenizer
  from transformer.infer.harness.lm import RunLM
  model, params, _ = _tiny_model("decoder_only", prefix_lm=True)
  tok = CharTokenizer(list("abcdefghi"))
  config = types.SimpleNamespace(model=model.config)
  pairs = [("abcd", "efg"), ("hi", "abcdefg")]
  prefix = _loglikelihoods(RunLM(config, model, params, None, tok, kind="seq2seq"), pairs)
  causal = _loglikelihoods(RunLM(config, model, params, None, tok, kind="lm"), pairs)
  for (context, continuation), (logp, _), (causal_logp, _) in zip(pairs, prefix, causal):
    ids, n = tok.encode(context + continuation), len(continuation)
    mask = np.asarray([[1] * len(context) + [0] * n])
    logits = models.batch_logits(model, params, {"targets": np.asarray([ids]), "prefix_mask": mask})
    assert logp == pytest.approx(_summed(logits[0], ids, n), abs=1e-4)
    logits = models.batch_logits(model, params, {"targets": np.asarray([ids])})
    assert causal_logp == pytest.approx(_summed(logits[0], ids, n), abs=1e-4)
    assert abs(logp - causal_logp) > 1e-3


def test_an_ensemble_scores_the_mean_of_its_members_probabilities():
  """Two members (the same random tiny LM, and one with other weights): log p of the ensemble is
  the log of the mean of the members' probabilities, request by request."""
  from decoding_fixtures import _tiny_model, random_params
  from transformer.data.tokenizers import CharTokenizer
  from transformer.infer.harness.lm import RunLM
  model, params, src = _tiny_model("decoder_only")
  other = random_params(model, (src,), seed=1)
  tok = CharTokenizer(list("abcdefghi"))
  config = types.SimpleNamespace(model=model.config)
  pairs = [("abcd", "efg"), ("", "hi")]
  one, two = (_loglikelihoods(RunLM(config, model, p, None, tok), pairs) for p in (params, other))
  both = _loglikelihoods(RunLM(config, (model, model), (params, other), None, tok), pairs)
  for (context, continuation), (logp, _), a, b in zip(pairs, both, one, two):
    ids, n = [0] + tok.encode(context + continuation), len(continuation)
    per_member = []
    for p in (params, other):
      logits = model.apply({"params": p}, np.asarray([ids[:-1]]), method="decode")[0]
      log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1))
      per_member.append([log_probs[i - 1, ids[i]] for i in range(len(ids) - n, len(ids))])
    want = float(np.sum(np.logaddexp(*per_member) - np.log(2)))
    assert logp == pytest.approx(want, abs=1e-4)
    assert a[0] != pytest.approx(b[0], abs=1e-3)  # the members differ
