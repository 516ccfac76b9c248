"""Ensembles (transformer/model/ensemble.py): the mean of several models' probabilities, scored
teacher-forced (scoring.make_eval_step), decoded with one KV cache per member (decoding.generate) and
read back from several runs (evaluation.evaluate_split, eval.py --ensemble).

The references are independent of the cached decoder: float64 NumPy means of softmaxes, and the
uncached training-path forward pass of each member (test_decoding's helpers).
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import g2p_mini
from decoding_fixtures import (_decode_cfg, _full_forward_log_probs, _jit_apply, _length,
                               _tiny_model, random_params)
from transformer.config import model_config
from transformer.infer import decoding, evaluation
from transformer.metrics import wer_per
from transformer.model import ensemble, scoring
from transformer.model.models import build_model

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")


def _np_log_mean_probs(*log_probs):
  """float64 log of the mean of the members' probabilities."""
  probs = [np.exp(np.asarray(lp, np.float64)) for lp in log_probs]
  probs = [p / p.sum(-1, keepdims=True) for p in probs]
  return np.log(np.mean(probs, axis=0))


def test_log_mean_probs_is_the_log_of_the_mean_probability():
  """Three members' logits (different scales and offsets: softmax must normalise each) against a
  float64 NumPy mean of their softmaxes; one member passes through untouched."""
  rng = np.random.default_rng(0)
  logits = [rng.normal(size=(4, 7)) * s + o for s, o in ((1.0, 0.0), (5.0, 3.0), (0.1, -8.0))]
  got = ensemble.log_mean_probs([jnp.asarray(x, jnp.float32) for x in logits])
  want = _np_log_mean_probs(*[x - np.log(np.exp(x).sum(-1, keepdims=True)) for x in logits])
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.exp(np.asarray(got)).sum(-1), 1.0, rtol=1e-6)
  single = jnp.asarray(logits[0], jnp.float32)
  assert ensemble.log_mean_probs([single]) is single


def test_members_errors():
  with pytest.raises(ValueError, match="2 models needs as many parameter trees, got one"):
    ensemble.members(("a", "b"), {"w": 1})
  with pytest.raises(ValueError, match="at least one model"):
    ensemble.members((), ())


def _two_members(arch):
  """Two different models over one vocabulary: positions, norm placement, depth, width, weights,
  and scanned against unrolled layers (each member's cache has its own layout)."""
  extra = {} if arch == "encoder_decoder" else {"prefix_lm": True}
  m1, p1, src = _tiny_model(arch, positional="sinusoidal" if arch == "encoder_decoder" else "rope",
                            **extra)
  m2 = build_model(model_config(
      arch=arch, vocab_size=13, source_vocab_size=11, d_model=24, num_heads=3, mlp_dim=40,
      num_encoder_layers=2, num_decoder_layers=3, dropout_rate=0.0, max_len=64,
      positional="relative", norm_position="pre", scan_layers=True, **extra))
  init_args = (src, src) if arch == "encoder_decoder" else (src,)
  return (m1, m2), (p1, random_params(m2, init_args, seed=1)), src


# Each search once per architecture in the default suite (greedy encoder-decoder, beam
# decoder-only); the other two pairs (~30 s each: two members' decoders compiled) under -m slow.
# Each architecture's own cache under greedy and beam: tests/infer/test_decoding.py.
@pytest.mark.parametrize("arch", ["encoder_decoder",
                                  pytest.param("decoder_only", marks=pytest.mark.slow)])
def test_ensemble_greedy_equals_mean_of_full_forward_probabilities(arch):
  """Cached ensemble greedy decoding picks at every step the argmax of the mean of the members'
  probabilities from uncached full forward passes, and its score is the log of that mean summed
  up to EOS: each member's cache, positions and masks advance together."""
  models, params, src = _two_members(arch)
  batch = {"inputs": src} if arch == "encoder_decoder" else {"prompt": src}
  eos, max_len = 5, 7
  gen, scores = decoding.generate(models, params, batch, _decode_cfg(), eos_id=eos,
                                  max_decode_len=max_len)
  gen = np.asarray(gen)
  members = [_full_forward_log_probs(m, p, src, gen, arch == "decoder_only")[0]
             for m, p in zip(models, params)]
  mean = _np_log_mean_probs(*members)
  alone = [decoding.generate(m, p, batch, _decode_cfg(), eos_id=eos, max_decode_len=max_len)[0]
           for m, p in zip(models, params)]
  assert not np.array_equal(np.asarray(alone[0]), np.asarray(alone[1]))  # the members disagree
  for r in range(len(src)):
    n = _length(gen[r], eos)
    np.testing.assert_array_equal(gen[r, :n], mean[r, :n, 1:].argmax(-1) + 1)  # pad excluded
    assert np.all(gen[r, n:] == 0)
    np.testing.assert_allclose(scores[r], mean[r, np.arange(n), gen[r, :n]].sum(), rtol=1e-4)


@pytest.mark.parametrize("arch", [pytest.param("encoder_decoder", marks=pytest.mark.slow),
                                  "decoder_only"])
def test_ensemble_beam_scores_are_the_mean_probability(arch):
  """Every beam's score is the length-penalised log of the members' mean probability of its
  tokens under uncached forward passes (each member's cache reordered with the beams), best first."""
  models, params, src = _two_members(arch)
  batch = {"inputs": src} if arch == "encoder_decoder" else {"prompt": src}
  eos, max_len, alpha, k = 5, 7, 0.6, 3
  beams, scores = decoding.generate(models, params, batch, _decode_cfg("beam", k, alpha),
                                    eos_id=eos, max_decode_len=max_len, return_all_beams=True)
  beams, scores = np.asarray(beams), np.asarray(scores)
  assert np.all(np.diff(scores, axis=1) <= 1e-6)
  for j in range(k):
    mean = _np_log_mean_probs(*[
        _full_forward_log_probs(m, p, src, beams[:, j], arch == "decoder_only")[0]
        for m, p in zip(models, params)])
    for r in range(len(src)):
      n = _length(beams[r, j], eos)
      logp = mean[r, np.arange(n), beams[r, j, :n]].sum()
      np.testing.assert_allclose(scores[r, j], logp / ((5 + n) / 6) ** alpha, rtol=1e-4)


@pytest.mark.slow  # 37 s: six decoders compiled; the mean-probability tests above cover ensembles
def test_ensemble_of_copies_is_the_model():
  """A model ensembled with itself decodes the same tokens with the same scores: greedy, beam,
  and sampling with temperature, top-k and top-p (the same key draws the same tokens)."""
  model, params, src = _tiny_model("encoder_decoder", positional="sinusoidal")
  for cfg in (_decode_cfg(), _decode_cfg("beam", 3, 0.6),
              _decode_cfg("sample", temperature=0.7, top_k=6, top_p=0.9)):
    one = decoding.generate(model, params, {"inputs": src}, cfg, eos_id=5, max_decode_len=7,
                            rng=jax.random.key(3))
    two = decoding.generate((model, model), (params, params), {"inputs": src}, cfg, eos_id=5,
                            max_decode_len=7, rng=jax.random.key(3))
    np.testing.assert_array_equal(np.asarray(one[0]), np.asarray(two[0]))
    np.testing.assert_allclose(np.asarray(one[1]), np.asarray(two[1]), rtol=1e-5)


def test_generate_rejects_mismatched_members():
  """Another architecture, another target vocabulary, a max_len too short: one line each,
  naming the member."""
  (m1, m2), (p1, p2), src = _two_members("encoder_decoder")
  other, p_other, _ = _tiny_model("decoder_only", positional="rope")
  cases = [((m1, other), (p1, p_other), dict(max_decode_len=7), "member 1 has model.arch"),
           ((m1, build_model(dataclasses.replace(m2.config, vocab_size=14))), (p1, p2),
            dict(max_decode_len=7), "member 1 has model.vocab_size=14"),
           ((m1, build_model(dataclasses.replace(m2.config, max_len=6))), (p1, p2),
            dict(max_decode_len=7), r"max_len=6 \(ensemble member 1\)")]
  for models, params, kwargs, message in cases:
    with pytest.raises(ValueError, match=message):
      decoding.generate(models, params, {"inputs": src}, _decode_cfg(), eos_id=5, **kwargs)


def test_ensemble_eval_step_scores_the_mean_probability():
  """Teacher-forced ensemble loss and accuracy equal float64 NumPy on the members' logits."""
  models, params, src = _two_members("encoder_decoder")
  targets = np.array([[3, 4, 5, 0], [6, 5, 0, 0], [7, 8, 9, 5]], np.int32)
  batch = {"inputs": jnp.asarray(src), "targets": jnp.asarray(targets)}
  sums = jax.device_get(jax.jit(scoring.make_eval_step(models))(params, batch))
  mean = _np_log_mean_probs(*[jax.nn.log_softmax(_jit_apply(m)({"params": p}, src, targets))
                              for m, p in zip(models, params)])
  weights = targets != 0
  nll = -np.take_along_axis(mean, targets[..., None], -1)[..., 0]
  assert sums["weight_sum"] == weights.sum()
  np.testing.assert_allclose(sums["loss_sum"], (nll * weights).sum(), rtol=1e-5)
  assert sums["correct_sum"] == ((mean.argmax(-1) == targets) & weights).sum()


# ----------------------------------------------------------------------------- trained runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Two mini G2P runs over the same words (so the same vocabularies): 60 steps seed 0, 40 steps
  seed 1."""
  from transformer.train.loop import train_and_evaluate  # pylint: disable=g-import-not-at-top
  first = g2p_mini.trained_run(tmp_path_factory)
  root = tmp_path_factory.mktemp("ensemble")
  second = str(root / "seed1")
  train_and_evaluate(g2p_mini.config(str(root / "data"), num_steps=40, seed=1), second)
  return first, second


def test_eval_py_ensemble_end_to_end(runs, tmp_path):
  """eval.py --ensemble writes to --out only (the runs' own files untouched); its WER/PER are those
  of its predictions, its loss differs from each member's, and it names the runs and steps."""
  first, second = runs
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  shutil.copytree(first, a)
  shutil.copytree(second, b)
  before = sorted(os.listdir(a)), sorted(os.listdir(b))
  out = str(tmp_path / "ab")
  proc = subprocess.run(
      [sys.executable, "eval.py", f"--workdir={a}", f"--ensemble={b}", f"--out={out}",
       "--split=test", "--step=latest"], cwd=REPO, env=ENV, capture_output=True, text=True,
      timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert (sorted(os.listdir(a)), sorted(os.listdir(b))) == before
  with open(os.path.join(out, "metrics.test.json")) as f:
    metrics = json.load(f)
  with open(os.path.join(out, "predictions.test.jsonl")) as f:
    preds = [json.loads(line) for line in f]
  assert metrics["ensemble"] == [a, b] and metrics["ensemble_steps"] == [60, 40]  # each its own
  assert metrics["ensemble_params"] == ["raw", "raw"]
  wer, per = wer_per([p["hypothesis"].split() for p in preds],
                     [[r.split() for r in p["references"]] for p in preds])
  assert metrics["wer"] == pytest.approx(wer) and metrics["per"] == pytest.approx(per)
  alone = [evaluation.evaluate_split(run, "test", verbose=False, out_dir=str(tmp_path / name))
           for run, name in ((a, "just_a"), (b, "just_b"))]
  assert all(metrics["loss"] != pytest.approx(m["loss"]) for m in alone)
  assert metrics["coverage"] == alone[0]["coverage"]


def test_restore_a_list_of_runs_is_their_ensemble(runs):
  """transformer.restore([a, b]) scores with the log of the members' mean probability (float64
  NumPy over each run's own teacher-forced logits), decodes greedily the argmax of that mean at
  every position of its outputs (uncached forward passes of the members), restores a list of
  one as that run bit for bit, and refuses `attention` in one line."""
  from transformer.infer import api  # pylint: disable=g-import-not-at-top
  first, second = runs
  both, a, b = api.restore([first, second]), api.restore(first), api.restore(second)
  assert both.members == (first, second) and both.step == (60, 40) and "ensemble of 2" in repr(both)
  words = ["hello", "world", "phoneme"]
  outputs = both.generate_text(words, method="greedy")
  batch = a._teacher_forced_batch(words, outputs)  # pylint: disable=protected-access
  probs = [np.exp(np.asarray(jax.nn.log_softmax(run.logits(words, outputs)), np.float64))
           for run in (a, b)]
  mean = (probs[0] + probs[1]) / 2
  tokens, weights = batch["targets"], batch["weights"]
  picked = np.log(np.take_along_axis(mean, tokens[..., None], -1)[..., 0])
  np.testing.assert_allclose(both.score(words, outputs), (picked * weights).sum(1), rtol=1e-5)
  np.testing.assert_array_equal(np.where(weights > 0, mean[..., 1:].argmax(-1) + 1, 0),
                                np.where(weights > 0, tokens, 0))  # pad excluded, as decoding does
  one = api.restore([first])
  assert one.members == () and one.step == a.step
  np.testing.assert_array_equal(one.score(words, outputs), a.score(words, outputs))
  with pytest.raises(ValueError, match="ensemble of 2 runs; restore one of them"):
    both.attention("hello")


def test_predict_cli_decodes_with_the_ensemble(runs, capsys):
  """python -m transformer.infer.predict --ensemble=B prints what restore([A, B]) decodes; a member
  given twice is one `error:` line saying so, exit 1."""
  from transformer.infer import api, predict  # pylint: disable=g-import-not-at-top
  first, second = runs
  words = ["hello", "world"]
  assert predict.main([f"--workdir={first}", f"--ensemble={second}", "--method=greedy",
                       *words]) == 0
  expected = api.restore([first, second]).generate_text(words, method="greedy")
  assert capsys.readouterr().out.splitlines() == [f"{w}\t{o}" for w, o in zip(words, expected)]
  assert predict.main([f"--workdir={first}", f"--ensemble={second},{second}", "hello"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: ") and "given twice" in err[0]


def test_ensemble_errors_are_one_line(runs, tmp_path):
  """No --out, a member given twice, a member with another vocabulary, a member that is no run,
  --out on a member, --out at another run's workdir: a one-line error naming the culprit, exit 1,
  nothing written."""
  first, second = runs
  other = str(tmp_path / "other")
  shutil.copytree(second, other)
  target = os.path.join(other, "tokenizers", "target", "tokenizer.json")
  with open(target) as f:
    vocab = json.load(f)
  vocab["units"][:2] = vocab["units"][1::-1]  # two phones swap ids
  with open(target, "w") as f:
    json.dump(vocab, f)
  for args, culprit in (([f"--ensemble={second}"], "give --out"),
                        ([f"--ensemble={second},{second}", f"--out={tmp_path}/x"], "given twice"),
                        ([f"--ensemble={other}", f"--out={tmp_path}/y"], "target vocabulary"),
                        ([f"--ensemble={tmp_path}/nothing", f"--out={tmp_path}/z"],
                         "the --workdir of a training run"),
                        ([f"--ensemble={second}", f"--out={second}"], "one of the ensemble's runs"),
                        ([f"--out={second}"], "holds another run")):
    proc = subprocess.run([sys.executable, "eval.py", f"--workdir={first}", "--split=test", *args],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, (culprit, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and culprit in lines[0], proc.stderr[-2000:]
  assert not any(os.path.exists(f"{tmp_path}/{d}") for d in "xyz")
  assert not os.path.exists(os.path.join(second, "metrics.test.json"))


def test_vocabulary_check_reads_sentencepiece_models(tmp_path):
  """Two runs whose SentencePiece models differ (their tokenizer.json files are identical: only
  the .model files tell them apart) are refused, naming the member; equal ones pass."""
  from transformer.data import tokenizers  # pylint: disable=g-import-not-at-top
  texts = [f"the {w} sat on the {v} mat" for w in ("cat", "dog", "bird", "fish") for v in
           ("red", "blue", "green")] * 20
  for name, corpus in (("a", texts), ("b", texts), ("c", [t.upper() for t in texts])):
    for side in ("source", "target"):
      tokenizers.build("sentencepiece", corpus, spm_vocab_size=40).save(
          str(tmp_path / name / "tokenizers" / side))
  assert ((tmp_path / "a/tokenizers/target/tokenizer.json").read_text() ==
          (tmp_path / "c/tokenizers/target/tokenizer.json").read_text())
  evaluation._same_vocabularies(str(tmp_path / "a"), str(tmp_path / "b"))
  with pytest.raises(evaluation.EvaluationError, match=f"member {tmp_path}/c: its source vocab"):
    evaluation._same_vocabularies(str(tmp_path / "a"), str(tmp_path / "c"))
