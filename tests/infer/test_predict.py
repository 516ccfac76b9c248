"""`python -m transformer.infer.predict` on encoder-only runs (transformer/infer/predict.py, api.Run's
mask_fillers, classify_with_probability, tag).

Three tiny runs trained here on CMUdict words (encoder_fixtures: 2 layers, d_model 32, a few
steps): a masked LM, a primary-stress classifier and a vowel/consonant tagger. Every printed
field is checked against logits computed by hand from the model on one BOS + ids + EOS row (no
padding, no batching) with a NumPy softmax and argmax over the ordinary ids.
"""

import io
import os

import numpy as np
import pytest

import transformer
from transformer.data.objectives import ExtraIds
from transformer.data.tokenizers import BOS_ID, EOS_ID, NUM_SPECIAL
from transformer.infer import predict
from transformer.model import models
from transformer.train.loop import train_and_evaluate
import encoder_fixtures

WORDS = ["banana", "information", "cat"]


def _tag_files(directory):
  """{train,validation,test}.tsv of `word<TAB>one tag per letter` (V vowel, C otherwise)."""
  os.makedirs(directory, exist_ok=True)
  words = ["hello", "world", "banana", "apple", "stress", "tagger", "encoder", "model", "aeiou",
           "rhythm", "queue", "strength"] * 4
  paths = {}
  for key, split in (("train_file", "train"), ("dev_file", "validation"), ("test_file", "test")):
    paths[key] = os.path.join(directory, f"{split}.tsv")
    with open(paths[key], "w") as f:
      f.writelines(f"{w}\t{' '.join('V' if c in 'aeiou' else 'C' for c in w)}\n" for w in words)
  return paths


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """{head: restored Run} of a masked LM, a classifier and a tagger trained a few steps."""
  root = tmp_path_factory.mktemp("predict_encoder")
  data = str(root / "data")
  tags = {f"data.{k}": v for k, v in _tag_files(str(root / "tags")).items()}
  # The masked LM is the 4-step run that tests/train/test_finetune.py fine-tunes, trained
  # once for both files.
  out = {"mlm": transformer.restore(encoder_fixtures.trained_mlm_run(tmp_path_factory))}
  configs = {"classify": encoder_fixtures.config(data, "classify", num_steps=4),
             "tag": encoder_fixtures.config(data, "tag", num_steps=4, **tags,
                                            **{"data.data_dir": str(root / "tags" / "tfds")})}
  for head, cd in configs.items():
    train_and_evaluate(cd, str(root / head))
    out[head] = transformer.restore(str(root / head))
  return out


def _hand_logits(run, ids):
  """Head logits of one BOS + ids + EOS row straight from the model, as float64."""
  row = np.array([[BOS_ID] + list(ids) + [EOS_ID]])
  return np.asarray(models.batch_logits(run.model, run.params, {"inputs": row}), np.float64)[0]


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _predict(capsys, *argv, stdin=None):
  """(exit status, stdout lines as field lists, stderr lines) of predict.main."""
  status = predict.main(list(argv), stdin=stdin)
  out, err = capsys.readouterr()
  return status, [line.split("\t") for line in out.splitlines()], err.splitlines()


def test_mlm_prints_the_filled_text_and_top_k_fillers_per_marker(runs, capsys):
  """An MLM run's line: the input, fill_mask's text, then per marker the --top_k most likely
  ordinary tokens of the hand-computed logits at that [MASK] (ordered, probabilities of the
  softmax over the ordinary tokens, 3 decimals); the first filler is the one filled in."""
  run = runs["mlm"]
  texts = ["ba_an_", "_at"]
  status, lines, err = _predict(capsys, f"--workdir={run.workdir}", "--top_k=3", *texts)
  assert status == 0 and not err and [f[0] for f in lines] == texts
  tok = run.source_tokenizer
  mask_id = ExtraIds(tok.vocab_size).mask_id
  for text, fields in zip(texts, lines):
    assert fields[1] == run.fill_mask(text)[0]
    ids = [mask_id if c == "_" else tok.encode(c)[0] for c in text]
    logits = _hand_logits(run, ids)
    at = [i + 1 for i, c in enumerate(text) if c == "_"]
    assert len(fields) == 2 + len(at)
    for i, field in zip(at, fields[2:]):
      probs = np.concatenate([np.zeros(NUM_SPECIAL),
                              _softmax(logits[i, NUM_SPECIAL:tok.vocab_size])])
      order = np.argsort(-logits[i, NUM_SPECIAL:tok.vocab_size], kind="stable")[:3] + NUM_SPECIAL
      want = [f"{tok.decode([int(j)])}={probs[j]:.3f}" for j in order]
      assert field.split("  ") == want
      assert fields[1][i - 1] == tok.decode([int(order[0])])


def test_classify_prints_the_argmax_label_and_its_probability(runs, capsys):
  """A classification run's line: input, the argmax of the hand-computed logits over the
  ordinary labels, and its softmax probability over those labels (4 decimals); lines come from
  stdin as well."""
  run = runs["classify"]
  status, lines, err = _predict(capsys, f"--workdir={run.workdir}",
                                stdin=io.StringIO("\n".join(WORDS) + "\n"))
  assert status == 0 and not err and [f[0] for f in lines] == WORDS
  for word, (_, label, prob) in zip(WORDS, lines):
    logits = _hand_logits(run, run.source_tokenizer.encode(word))[0]
    best = int(logits[NUM_SPECIAL:run.target_tokenizer.vocab_size].argmax()) + NUM_SPECIAL
    assert label == run.target_tokenizer.decode([best]) == run.classify(word)[0]
    vocab = run.target_tokenizer.vocab_size
    assert prob == f"{_softmax(logits[NUM_SPECIAL:vocab])[best - NUM_SPECIAL]:.4f}"


def test_tag_prints_one_tag_per_token(runs, capsys):
  """A tagging run's line: input, then `token/tag` for each letter, the tag the argmax of the
  hand-computed logits at that token over the ordinary tag ids."""
  run = runs["tag"]
  words = ["banana", "strength", "cat"]  # letters of the tagger's training words
  status, lines, err = _predict(capsys, f"--workdir={run.workdir}", *words)
  assert status == 0 and not err and [f[0] for f in lines] == words
  for word, (_, tags) in zip(words, lines):
    logits = _hand_logits(run, run.source_tokenizer.encode(word))[1:-1]
    best = logits[:, NUM_SPECIAL:run.target_tokenizer.vocab_size].argmax(-1) + NUM_SPECIAL
    want = [f"{c}/{run.target_tokenizer.decode([int(b)])}" for c, b in zip(word, best)]
    assert tags.split(" ") == want and len(want) == len(word)
  assert repr(run).endswith("arch=encoder_only, d_model=32, layers=2+0)")  # no decoder stack


def test_bad_lines_and_flags_are_one_line_errors(runs, capsys):
  """Per bad input one `error:` line naming it (no marker, a character outside the vocabulary,
  longer than data.max_source_len) while the good ones are still printed, exit status 1; a
  decoding flag on an encoder-only run, or --top_k=0, is one line and status 1."""
  run = runs["mlm"]
  long = "a" * (run.config.data.max_source_len - 1) + "_"
  status, lines, err = _predict(capsys, f"--workdir={run.workdir}", "hello", "he_l\u00e9",
                                "he_lo", long)
  assert status == 1 and [f[0] for f in lines] == ["he_lo"]
  assert len(err) == 3 and all(e.startswith("error: input ") for e in err)
  assert "has no mask marker '_' (--mask)" in err[0] and "'\u00e9'" in err[1]
  assert "data.max_source_len" in err[2]
  status, lines, err = _predict(capsys, f"--workdir={run.workdir}", "--mask=[M]", "he[M]lo")
  assert status == 0 and lines[0][1] == run.fill_mask("he_lo")[0]
  for flag, head in (("--method=beam", "mlm"), ("--top_k=2", "classify")):
    status, lines, err = _predict(capsys, f"--workdir={runs[head].workdir}", flag, "hello")
    assert status == 1 and not lines and len(err) == 1
    assert err[0].startswith(f"error: {flag.split('=')[0]} is a decoding option")
  status, lines, err = _predict(capsys, f"--workdir={run.workdir}", "--top_k=0", "he_lo")
  assert status == 1 and err == ["error: --top_k=0 must be >= 1"]
