"""`train.py --init_from` for encoder-only fine-tuning (transformer/train/finetune.py: init_from_config,
init_params with a fresh tree, shared_params): the pretrained encoder and embeddings load
exactly, the new head is freshly initialised (its keys the new config's unless a masked LM
continues), and mismatched parameters are one line naming them. Then the restored runs'
`classify()` and `fill_mask()` against logits computed by hand."""

import dataclasses
import os

import jax
import numpy as np
import pytest

import transformer
from transformer.config import ConfigError, from_configdict
from transformer.data.tokenizers import BOS_ID, EOS_ID, NUM_SPECIAL
from transformer.infer.evaluation import evaluate_split
from transformer.model import models, scoring
from transformer.run import restore
from transformer.train import finetune
from transformer.train.loop import train_and_evaluate
import encoder_fixtures


def _flat(tree):
  return {jax.tree_util.keystr(k): np.asarray(v) for k, v in
          jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory):
  """(a directory of this module's own, the 4-step MLM run's workdir: shared with
  tests/infer/test_predict.py, read only)."""
  root = tmp_path_factory.mktemp("mlm")
  return root, encoder_fixtures.trained_mlm_run(tmp_path_factory)


def test_fine_tuning_loads_exactly_the_shared_weights(mlm_run, tuned_run):
  """Leaf by leaf: every encoder and embedding parameter of the classifier equals the MLM run's,
  the head's equal a fresh init's, and nothing else exists (tuned_run: a real fine-tuning run
  from it trains)."""
  root, workdir = mlm_run
  pretrained = _flat(restore.restore_params(restore.load_run_config(workdir), workdir)[0])
  cfg = finetune.init_from_config(
      from_configdict(encoder_fixtures.config(str(root / "data"), "classify")), workdir)
  assert cfg.model.head == "classify" and cfg.model.vocab_size > 0  # the run's vocabulary
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, num_classes=7))
  model = models.build_model(cfg.model)
  fresh = scoring.init_params(model, jax.random.key(1), models.example_batch(cfg.model))
  loaded = _flat(finetune.init_params(workdir, fresh))
  fresh = _flat(fresh)
  assert set(loaded) == set(fresh)
  heads = {k for k in loaded if k.startswith("['head']")}
  assert heads == {"['head']['classifier']['kernel']"}
  for k in loaded:
    np.testing.assert_array_equal(loaded[k], fresh[k] if k in heads else pretrained[k])
  assert set(pretrained) == set(loaded) - heads  # the tied MLM run has no head of its own


@pytest.fixture(scope="module")
def tuned_run(mlm_run):
  root, workdir = mlm_run
  result = train_and_evaluate(encoder_fixtures.config(str(root / "data"), "classify", num_steps=3),
                              str(root / "tuned"), init_from=workdir)
  assert np.isfinite(result["eval/accuracy"]) and "eval/f1" in result
  return str(root / "tuned")


def _hand_logits(run, ids):
  """Head logits of one BOS + ids + EOS row, straight from the model (no padding, no batching)."""
  row = np.array([[BOS_ID] + list(ids) + [EOS_ID]])
  return np.asarray(models.batch_logits(run.model, run.params, {"inputs": row}))[0]


def test_eval_reports_label_accuracy_and_f1_over_the_whole_split(tuned_run):
  """eval.py's evaluate_split on a classifier: accuracy and macro F1 of every test word (one
  scored label each), nothing decoded."""
  results = evaluate_split(tuned_run, "test", verbose=False)
  test_file = os.path.join(os.path.dirname(tuned_run), "data", "test.tsv")
  with open(test_file) as f:
    words = {line.split("\t")[0] for line in f if line.strip()}
  assert results["coverage"]["scored_tokens"] == len(words) and 0 <= results["f1"] <= 1
  assert 0 <= results["accuracy"] <= 1 and "decode" not in results


def test_classify_gives_the_argmax_label_of_each_word(tuned_run):
  """Run.classify (batched, padded) == the label of the argmax of the hand-computed logits over
  the label ids; a fine-tuned run reads words with the pretrained run's tokenizer."""
  run = transformer.restore(tuned_run)
  words = ["hello", "banana", "a", "information"]
  got = run.classify(words)
  for word, label in zip(words, got):
    logits = _hand_logits(run, run.source_tokenizer.encode(word))[0]
    best = int(logits[NUM_SPECIAL:run.target_tokenizer.vocab_size].argmax()) + NUM_SPECIAL
    assert label == run.target_tokenizer.decode([best]) and label.isdigit()


def test_fill_mask_replaces_only_the_markers_by_the_best_ordinary_token(mlm_run):
  """Run.fill_mask keeps every unmasked character and puts at each marker the most likely
  ordinary token of the hand-computed logits at that [MASK] position."""
  run = transformer.restore(mlm_run[1])
  got = run.fill_mask(["he_lo", "_at"])
  tok = run.source_tokenizer
  mask_id = tok.vocab_size  # objectives.ExtraIds: [MASK] right after the tokenizer's ids
  for text, filled in zip(["he_lo", "_at"], got):
    assert len(filled) == len(text)
    assert all(a == b for a, b in zip(text, filled) if a != "_")
    at = text.index("_")
    ids = [mask_id if c == "_" else tok.encode(c)[0] for c in text]
    logits = _hand_logits(run, ids)[at + 1]
    assert filled[at] == tok.decode([int(logits[NUM_SPECIAL:tok.vocab_size].argmax()) + NUM_SPECIAL])
  with pytest.raises(ValueError, match="needs head 'classify'"):
    run.classify(["hello"])


def test_mismatched_parameters_are_one_line_naming_them():
  """A missing leaf and a leaf of another shape are both named in one ConfigError line."""
  fresh = {"token_embed": {"embedding": np.zeros((9, 4))},
           "encoder": {"layers_0": {"w": np.zeros((4, 4)), "b": np.zeros(4)}},
           "head": {"classifier": {"kernel": np.zeros((4, 3))}}}
  pretrained = {"token_embed": {"embedding": np.zeros((8, 4))},
                "encoder": {"layers_0": {"w": np.zeros((4, 4))}}}
  with pytest.raises(ConfigError) as e:
    finetune.shared_params(pretrained, fresh, "runs/mlm")
  message = str(e.value)
  assert "\n" not in message and "--init_from=runs/mlm" in message
  assert "missing in the run: encoder/layers_0/b" in message
  assert "shapes differ: token_embed/embedding" in message


@pytest.mark.parametrize("source_arch,source_head,new_head,continued", [
    ("encoder_only", "mlm", "mlm", True), ("encoder_only", "mlm", "classify", False),
    ("encoder_decoder", "mlm", "mlm", False), ("encoder_only", "classify", "mlm", False)])
def test_head_keys_are_the_runs_only_when_its_masked_lm_head_continues(
    tmp_path, source_arch, source_head, new_head, continued):
  """init_from_config (a run's config.json is all it reads): the vocabulary head's knobs
  (head_transform, logits_bias, tie_embeddings) are the run's when a masked-LM config continues an
  encoder-only masked-LM run, else the new config's; the encoder's own knobs (embedding_norm,
  norm_position) are always the run's. A masked-LM objective reads the run's tokenizer on both
  sides, a classifier keeps its label tokenizer."""
  import json
  from transformer.config import to_dict
  run = from_configdict(encoder_fixtures.config(str(tmp_path / "d"), "mlm", **{
      "model.arch": source_arch, "model.head": source_head, "model.num_decoder_layers": 1,
      "model.tie_embeddings": False, "model.head_transform": True, "model.logits_bias": True,
      "model.embedding_norm": True, "model.norm_position": "post", "data.tokenizer": "byte",
      "data.source_tokenizer": "" if source_arch == "encoder_only" else "char",
      "data.objective": "mlm" if source_head == "mlm" and source_arch == "encoder_only" else "none",
      "data.label": "none" if source_head == "mlm" else "primary_stress"}))
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "config.json").write_text(json.dumps(to_dict(run)))
  new = from_configdict(encoder_fixtures.config(str(tmp_path / "d"), new_head))
  got = finetune.init_from_config(new, str(tmp_path / "run"))
  knobs = lambda m: (m.head_transform, m.logits_bias, m.tie_embeddings)  # noqa: E731
  assert knobs(got.model) == knobs((run if continued else new).model)
  assert got.model.embedding_norm and got.model.norm_position == "post"
  assert finetune.continues_head(run, new_head) == continued
  source = "byte" if source_arch == "encoder_only" else "char"
  assert got.data.source_tokenizer == source
  assert got.data.tokenizer == (source if new_head == "mlm" else new.data.tokenizer)
