"""Tests of evaluation.py, eval.py, predict.py and the notebook API (transformer/infer/api.py).

Most tests share one tiny G2P run trained by `train_and_evaluate` on a few hundred CMUdict words
(tests/g2p_mini.py), read through the real data layer.
"""

import io
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import sacrebleu

import g2p_mini
from configs import base
from transformer.config import ConfigError, from_configdict, to_dict
from transformer.infer import api, evaluation, predict
from transformer.metrics import wer_per
from transformer.run import restore

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
  return g2p_mini.trained_run(tmp_path_factory)


@pytest.fixture(scope="module")
def run(workdir):
  return api.restore(workdir)


def _tsv_lines(workdir, key="test_file"):
  """(word, pronunciation) lines of the run's data.<key> TSV file, in file order."""
  with open(os.path.join(workdir, "config.json")) as f:
    path = json.load(f)["data"][key]
  with open(path) as f:
    return [tuple(line.rstrip("\n").split("\t")) for line in f]


def _test_words(workdir):
  """word -> its reference pronunciations, read straight from the run's test TSV file."""
  refs = {}
  for word, pron in _tsv_lines(workdir):
    refs.setdefault(word, []).append(pron)
  return refs


def _tokens(lines):
  """Target tokens of (word, pronunciation) records: the phones and an EOS each."""
  return sum(len(pron.split()) + 1 for _, pron in lines)


# ----------------------------------------------------------------------------- no trained run


def test_prediction_metrics_no_stress_and_stress_tracks():
  """WER/PER by hand on multi-reference words: the no-stress track strips digits, the stress
  track (present only when references carry stress) keeps them; PER ties take the shorter ref."""
  preds = [dict(hypothesis="HH AH0 L OW1", references=["HH AH0 L OW1", "HH EH0 L OW1"]),
           dict(hypothesis="W ER1 L D", references=["W ER0 L D"]),
           dict(hypothesis="K AE1 T", references=["K AE1 T S", "K AH1 T"])]
  got = evaluation.prediction_metrics(["wer", "per"], preds)
  assert got["wer"] == pytest.approx(1 / 3) and got["per"] == pytest.approx(1 / 11)
  assert got["wer_stress"] == pytest.approx(2 / 3) and got["per_stress"] == pytest.approx(2 / 11)
  plain = [dict(p, hypothesis=evaluation.strip_stress(p["hypothesis"]),
                references=[evaluation.strip_stress(r) for r in p["references"]]) for p in preds]
  assert set(evaluation.prediction_metrics(["wer", "per"], plain)) == {"wer", "per"}


def test_prediction_metrics_bleu_equals_sacrebleu():
  """BLEU of prediction records equals sacrebleu.corpus_bleu on the same detokenised strings."""
  preds = [dict(hypothesis="the cat sat on the mat .", references=["the cat sat on a mat ."]),
           dict(hypothesis="hello , world !", references=["hello world !"])]
  want = sacrebleu.corpus_bleu([p["hypothesis"] for p in preds],
                               [[p["references"][0] for p in preds]]).score
  assert evaluation.prediction_metrics(["bleu"], preds)["bleu"] == pytest.approx(want)


def test_load_config_applies_only_safe_overrides(tmp_path):
  """Overrides land on the saved config; structural or unknown keys are one-line ConfigErrors
  naming the key; a workdir without config.json names the file."""
  cd = base.get_config()
  cd.model.update(vocab_size=40, source_vocab_size=30)
  (tmp_path / "config.json").write_text(json.dumps(to_dict(from_configdict(cd))))
  cfg = restore.load_run_config(str(tmp_path), {"eval.decode.beam_size": 7,
                                               "eval.decode.method": "greedy"})
  assert (cfg.eval.decode.beam_size, cfg.eval.decode.method, cfg.model.vocab_size) == (7, "greedy", 40)
  with pytest.raises(ConfigError, match=r"model\.d_model") as e:
    restore.load_run_config(str(tmp_path), {"model.d_model": 64})
  assert "\n" not in str(e.value)
  with pytest.raises(ConfigError, match=r"eval\.decode\.nope"):
    restore.load_run_config(str(tmp_path), {"eval.decode.nope": 1})
  with pytest.raises(evaluation.EvaluationError, match="config.json"):
    restore.load_run_config(str(tmp_path / "missing"))


# ----------------------------------------------------------------------------- on the trained run


def test_eval_py_end_to_end(workdir):
  """eval.py with --config overrides: the metrics file's WER/PER equal wer_per recomputed from the
  written predictions, which carry every reference of each test word and honour the overrides;
  its last line names the two files."""
  out = subprocess.run(
      [sys.executable, "eval.py", f"--workdir={workdir}", "--split=test", "--step=latest",
       "--config.eval.num_decode_examples=20", "--config.eval.decode.method=beam",
       "--config.eval.decode.beam_size=2"], cwd=REPO, env=ENV, capture_output=True, text=True,
      timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "wer" in out.stdout and "per" in out.stdout
  with open(os.path.join(workdir, "metrics.test.json")) as f:
    metrics = json.load(f)
  with open(os.path.join(workdir, "predictions.test.jsonl")) as f:
    preds = [json.loads(line) for line in f]
  assert len(preds) == metrics["coverage"]["decoded_examples"] == 20
  assert "beam=2" in metrics["decode"]
  assert re.search(r"\ndecoded +20 of 48 examples \(41\.7% of the split: a partial", out.stdout)
  assert out.stdout.strip().splitlines()[-1] == "wrote " + ", ".join(
      os.path.join(workdir, n) for n in ("metrics.test.json", "predictions.test.jsonl"))
  refs = _test_words(workdir)
  assert any(len(r) > 1 for r in refs.values())  # the test really has multi-reference words
  for p in preds:
    assert set(p) == {"source", "references", "hypothesis", "score"}
    assert p["references"] == refs[p["source"]]
  wer, per = wer_per([p["hypothesis"].split() for p in preds],
                     [[r.split() for r in p["references"]] for p in preds])
  assert metrics["wer"] == pytest.approx(wer) and metrics["per"] == pytest.approx(per)
  assert metrics["perplexity"] == pytest.approx(np.exp(metrics["loss"]))
  assert 0 < metrics["accuracy"] < 1


def test_evaluate_covers_the_whole_split_unless_asked_for_less(workdir, tmp_path):
  """The run trained with eval.num_decode_examples=16 (a partial in-training dev evaluation), yet
  evaluate() decodes every test word and scores every test token (counted from the TSV file), and
  says so in `coverage`; explicit overrides evaluate exactly the first 5 words and the first
  batch of 16 lines, and coverage reports that part of the whole."""
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  assert restore.load_run_config(run).eval.num_decode_examples == 16
  lines = _tsv_lines(run)
  words = list(dict.fromkeys(w for w, _ in lines))
  whole = evaluation.evaluate_split(run, "test", verbose=False)
  assert whole["coverage"] == {"decoded_examples": len(words), "split_examples": len(words),
                               "scored_tokens": _tokens(lines), "split_tokens": _tokens(lines)}
  with open(os.path.join(run, "predictions.test.jsonl")) as f:
    assert [json.loads(line)["source"] for line in f] == words
  part = evaluation.evaluate_split(run, "test", overrides={"eval.num_decode_examples": 5,
                                                    "eval.num_batches": 1}, verbose=False)
  assert part["coverage"] == {"decoded_examples": 5, "split_examples": len(words),
                              "scored_tokens": _tokens(lines[:16]), "split_tokens": _tokens(lines)}
  with open(os.path.join(run, "metrics.test.json")) as f:
    assert json.load(f)["coverage"] == part["coverage"]
  table = evaluation.format_table(part)
  assert f"decoded     5 of {len(words)} examples" in table and "partial" in table
  # A classifier scores one label per example: its scored line counts examples, not tokens.
  whole = {"coverage": {"scored_tokens": 359, "split_tokens": 359}}
  assert evaluation.format_table(whole, "examples").splitlines() == [
      "scored  359 of 359 examples (the whole split)"]


def test_in_training_evaluation_says_it_is_partial(workdir):
  """metrics.jsonl's in-training dev evaluation logs eval/decoded_examples (16, the run's
  eval.num_decode_examples, fewer than the dev file's words) and eval/scored_tokens (every dev
  token: eval.num_batches=0), so a partial dev WER cannot pass for a whole-split one."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    logged = [r for r in map(json.loads, f) if "eval/wer" in r]
  dev = _tsv_lines(workdir, "dev_file")
  assert logged and len({w for w, _ in dev}) > 16
  assert logged[-1]["eval/decoded_examples"] == 16
  assert logged[-1]["eval/scored_tokens"] == _tokens(dev)


def test_only_process_0_writes_the_results(tmp_path, monkeypatch):
  """On several hosts every process evaluates the whole split and only process 0 writes
  metrics.<split>.json and predictions.<split>.jsonl: write_results with jax.process_index()
  faked by monkeypatch as 1 writes nothing, as 0 writes both (non-finite values as null)."""
  results, preds = {"split": "test", "loss": float("nan")}, [{"source": "a", "hypothesis": "A"}]
  monkeypatch.setattr(evaluation.jax, "process_index", lambda: 1)
  assert not evaluation.write_results(str(tmp_path), "test", results, preds)
  assert os.listdir(tmp_path) == []
  monkeypatch.setattr(evaluation.jax, "process_index", lambda: 0)
  assert evaluation.write_results(str(tmp_path), "test", results, preds)
  assert json.loads((tmp_path / "metrics.test.json").read_text()) == {"split": "test", "loss": None}
  assert json.loads((tmp_path / "predictions.test.jsonl").read_text()) == preds[0]


def test_restore_leaves_an_in_flight_save_alone(workdir, tmp_path):
  """Restoring only reads: a `<step>.orbax-checkpoint-tmp-*` directory (an async save training
  has in flight) survives `api.restore`, and no other file of the workdir changes."""
  run = tmp_path / "run"
  shutil.copytree(workdir, run)
  step = max(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
  in_flight = run / "checkpoints" / f"{step + 1}.orbax-checkpoint-tmp-1234567"
  shutil.copytree(run / "checkpoints" / str(step), in_flight)
  before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
  api.restore(str(run))
  assert in_flight.is_dir()
  assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_eval_py_rejects_structural_override(workdir):
  """A --config.model.* override at evaluation is one line on stderr and exit status 1."""
  out = subprocess.run([sys.executable, "eval.py", f"--workdir={workdir}",
                        "--config.model.d_model=64"], cwd=REPO, env=ENV, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 1
  assert out.stderr.strip().count("\n") == 0 and "model.d_model" in out.stderr, out.stderr


def test_restore_errors_name_the_step(workdir):
  """An unknown step or a workdir without checkpoints is a one-line EvaluationError."""
  cfg = restore.load_run_config(workdir)
  with pytest.raises(evaluation.EvaluationError, match="step 999"):
    restore.restore_params(cfg, workdir, 999)
  with pytest.raises(evaluation.EvaluationError, match="integer"):
    restore.restore_params(cfg, workdir, "newest")


def test_restore_in_fresh_process_gives_identical_logits(workdir, run, tmp_path):
  """Logits of a run restored in a new Python process are bitwise equal to this process's."""
  words, prons = ["hello", "cat"], ["HH AH L OW", "K AE T"]
  script = (f"import numpy as np; from transformer.infer import api; "
            f"run = api.restore({workdir!r}); "
            f"np.save({str(tmp_path / 'l.npy')!r}, run.logits({words!r}, {prons!r}))")
  out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=ENV, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  theirs, ours = np.load(tmp_path / "l.npy"), run.logits(words, prons)
  assert ours.dtype == np.float32 and np.array_equal(ours, theirs)


def test_generate_scores_match_teacher_forced_scores(run):
  """Greedy decoding's summed log-probs (KV cache) equal `score` of its outputs (full forward);
  sampling with top_k=1 is greedy; the same seed gives the same samples."""
  words = ["hello", "world", "cat"]
  greedy = run.generate_text(words, method="greedy")
  ids = [run.encode_source(w) for w in words]
  _, scores = evaluation.decode_batches(run.config, run.model, run.params, ids,
                                        run.config.eval.decode, eos_id=1, batch_size=4)
  np.testing.assert_allclose(scores, run.score(words, greedy), atol=1e-4)
  assert run.generate_text(words, method="sample", top_k=1, seed=3) == greedy
  a = run.generate_text(words, method="sample", temperature=2.0, seed=5)
  assert a == run.generate_text(words, method="sample", temperature=2.0, seed=5)


def test_attention_shapes_and_normalisation(run):
  """`.attention` gives every layer and head: [n, s, s] encoder, [n, t, t] causal decoder and
  [n, t, s] cross weights over the labelled tokens, each row summing to 1 over the keys."""
  att = run.attention("hello", "HH AH L OW")
  m = run.config.model
  assert att.source_tokens == list("hello") + ["</s>"]
  assert att.target_tokens == ["<s>", "HH", "AH", "L", "OW"]
  n, s, t = m.num_heads, 6, 5
  assert len(att.encoder_self) == m.num_encoder_layers
  assert len(att.decoder_self) == len(att.cross) == m.num_decoder_layers
  assert all(w.shape == (n, s, s) for w in att.encoder_self)
  assert all(w.shape == (n, t, t) for w in att.decoder_self)
  assert all(w.shape == (n, t, s) for w in att.cross)
  for w in att.encoder_self + att.decoder_self + att.cross:
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
  for w in att.decoder_self:
    assert np.abs(np.triu(w, 1)).max() < 1e-6  # causal: no query sees a later token


def test_predict_cli_gives_one_line_errors(workdir):
  """python -m transformer.infer.predict decodes good inputs and prints one `error:` line (no traceback)
  for unknown characters and over-long inputs; exit status 1."""
  out = subprocess.run(
      [sys.executable, "-m", "transformer.infer.predict", f"--workdir={workdir}", "Hello", "héllo",
       "a" * 40], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
  assert out.returncode == 1, out.stderr[-2000:]
  lines = out.stdout.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("Hello\t") and lines[0].split("\t")[1]
  errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
  assert "Traceback" not in out.stderr and len(errors) == 2, out.stderr
  assert "input 2" in errors[0] and "'é'" in errors[0]
  assert "input 3" in errors[1] and "data.max_source_len" in errors[1]


def test_predict_stdin_empty_lines_and_bad_workdir(workdir, tmp_path, capsys):
  """Lines on stdin are decoded; an empty line is a one-line error; a bad workdir is one line."""
  status = predict.main([f"--workdir={workdir}"], stdin=io.StringIO("cat\n\n"))
  out, err = capsys.readouterr()
  assert status == 1 and out.startswith("cat\t") and len(out.strip().splitlines()) == 1
  assert err.strip() == "error: input 2 '' is empty"
  assert predict.main([f"--workdir={tmp_path}", "cat"]) == 1
  assert capsys.readouterr().err.count("\n") == 1
