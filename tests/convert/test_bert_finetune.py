"""Fine-tuning a converted BERT (`train.py --init_from=<converted>`, transformer/train/finetune.py).

Offline: test_bert.py's tiny random BertForMaskedLM (untied head: the head has every
tensor BERT's can have), converted, then trained for 2 steps (dropout off, so the first logged
loss is the step-0 parameters' own) by train.py's train_and_evaluate with
  - configs/classify.py on CMUdict stress words (encoder_fixtures' small files): a new
    classification head on BERT's encoder, read through BERT's WordPiece tokenizer;
  - configs/mlm.py:text on a small text file: continued masked-LM training of the whole model
    (whole-word masking, mlm.py:text's default, over BERT's WordPiece words).
References: the converted checkpoint as restore_params reads it, a fresh init of the classifier's
config, and the loss of the converted model itself (transformer.restore of the converted workdir)
on the same first batch.
"""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformer  # noqa: E402
from transformer import convert, keyspec, schema  # noqa: E402
from transformer.config import ConfigError, from_configdict  # noqa: E402
from transformer.data import load_task  # noqa: E402
from transformer.model import models, scoring
from transformer.run import restore
from transformer.train import finetune
from transformer.train.loop import train_and_evaluate  # noqa: E402
from configs import classify, mlm  # noqa: E402
import encoder_fixtures  # noqa: E402
import test_bert  # noqa: E402

STEPS = 2
# Model keys a fine-tuning config sets itself (config role finetune) or, with a new head, the
# head's own (roles head, vocab_head): everything else is the converted BERT's.
FINETUNE_KEYS = schema.with_role(keyspec.FINETUNE, "model")
NEW_HEAD_KEYS = (FINETUNE_KEYS + schema.with_role(keyspec.HEAD, "model")
                 + schema.with_role(keyspec.VOCAB_HEAD, "model"))


def _flat(tree):
  return {jax.tree_util.keystr(k): np.asarray(v)
          for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
  return tmp_path_factory.mktemp("bertft")


@pytest.fixture(scope="module")
def converted(root):
  """The converted workdir of an untied random BERT."""
  test_bert.save_tiny_bert(str(root / "hf"), tied=False)
  convert.from_hf(str(root / "hf"), str(root / "bert"))
  return str(root / "bert")


def _tiny(cd, **overrides):
  """`cd` shrunk to STEPS steps with dropout off (the first logged loss is step 0's)."""
  cd.update_from_flattened_dict({
      "train.num_steps": STEPS, "train.log_every_steps": 1, "train.warmup_steps": 1,
      "eval.every_steps": STEPS, "checkpoint.every_steps": STEPS, "data.batch_size": 8,
      "model.dropout_rate": 0.0, **overrides})
  return cd


def _classify_config(root):
  paths = encoder_fixtures.write_stress_files(str(root / "data"))
  return _tiny(classify.get_config(), **{
      "data.dataset": "cmudict_g2p", "data.data_dir": str(root / "data" / "tfds"),
      **{f"data.{k}": v for k, v in paths.items()}})


def _mlm_config(root, **overrides):
  text_file = root / "corpus.txt"
  text_file.write_text("\n".join(test_bert.SENTENCES) + "\n", encoding="utf-8")
  return _tiny(mlm.get_config("text"), **{
      "data.text_file": str(text_file), "data.data_dir": str(root / "tfds_text"),
      "data.max_source_len": 32, "data.max_target_len": 32,  # BERT's max_position_embeddings
      **overrides})


def _train(cd, workdir, init_from):
  """train.py's train_and_evaluate; (workdir, the logged metrics lines)."""
  train_and_evaluate(cd, workdir, init_from=init_from)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return workdir, [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def classifier(root, converted):
  return _train(_classify_config(root), str(root / "classifier"), converted)


@pytest.fixture(scope="module")
def continued(root, converted):
  return _train(_mlm_config(root), str(root / "continued"), converted)


def _first_batch_loss(model, params, cfg, workdir):
  """The unsmoothed loss of `params` on the first training batch of the run in `workdir`."""
  batch = next(iter(load_task(cfg, workdir).train_iterator()))
  sums = scoring.make_eval_step(model)(params, batch)
  return float(sums["loss_sum"]) / float(sums["weight_sum"])


def _first_logged_loss(lines):
  return next(m["train/loss"] for m in lines if m.get("step") == 1 and "train/loss" in m)


def test_classifier_loads_berts_encoder_exactly_and_a_fresh_head(converted, classifier):
  """configs/classify.py --init_from=<converted BERT>: the run's model is BERT's (post-LN,
  learned positions, embedding LayerNorm...) with the classifier's head keys, and BERT's MLM-head
  knobs (head_transform, logits_bias) off: the classifier has no vocabulary head. Its step-0
  parameters are BERT's token embedding and encoder bitwise, plus one fresh classifier kernel
  (a from-scratch init's) and nothing of BERT's MLM head; the run's first logged loss is those
  parameters' loss on its first batch, and it reads words with BERT's WordPiece tokenizer."""
  workdir, lines = classifier
  bert = transformer.restore(converted)
  cfg = restore.load_run_config(workdir)
  assert cfg.model.head == "classify" and cfg.model.num_classes > 0
  assert not cfg.model.head_transform and not cfg.model.logits_bias
  assert cfg.model.embedding_norm and cfg.model.norm_position == "post"
  same = lambda m: dataclasses.replace(m, **{k: None for k in NEW_HEAD_KEYS})  # noqa: E731
  assert same(cfg.model) == same(bert.config.model)
  assert (cfg.data.source_tokenizer, cfg.data.tokenizer) == ("hf", "symbol")
  tuned = transformer.restore(workdir)
  assert tuned.source_tokenizer == bert.target_tokenizer

  model = models.build_model(cfg.model)
  fresh = scoring.init_params(model, jax.random.fold_in(jax.random.PRNGKey(cfg.seed), 1),
                            models.example_batch(cfg.model))
  start = finetune.init_params(converted, fresh, cfg.model.head)
  loaded, pretrained, fresh = _flat(start), _flat(bert.params), _flat(fresh)
  heads = {k for k in loaded if k.startswith("['head']")}
  assert heads == {"['head']['classifier']['kernel']"}
  assert set(loaded) - heads == {k for k in pretrained if not k.startswith("['head']")}
  for k in loaded:
    np.testing.assert_array_equal(loaded[k], fresh[k] if k in heads else pretrained[k], err_msg=k)
  np.testing.assert_allclose(_first_logged_loss(lines),
                             _first_batch_loss(model, start, cfg, workdir), rtol=1e-5)
  assert tuned.classify(["the cat"])[0].isdigit()


def test_continued_mlm_starts_from_exactly_the_converted_model(converted, continued):
  """configs/mlm.py:text --init_from=<converted BERT> continues BERT's own masked LM: the model
  config is BERT's (its MLM head's transform, bias and untied decoder included) but for dropout;
  both sides read BERT's tokenizer (mlm.py's char tokenizer is replaced, not built from the
  text) and whole-word masking follows its '##' pieces; the step-0 parameters are the converted checkpoint's, every leaf, head too; and the
  run's first logged loss is the converted model's own loss on that first batch."""
  workdir, lines = continued
  bert = transformer.restore(converted)
  cfg = restore.load_run_config(workdir)
  keep = {k: None for k in FINETUNE_KEYS}
  assert dataclasses.replace(cfg.model, **keep) == dataclasses.replace(bert.config.model, **keep)
  assert cfg.model.head_transform and cfg.model.logits_bias and not cfg.model.tie_embeddings
  assert (cfg.data.tokenizer, cfg.data.source_tokenizer) == ("hf", "hf")
  assert cfg.data.whole_word_masking
  tuned = transformer.restore(workdir)
  assert tuned.source_tokenizer == tuned.target_tokenizer == bert.target_tokenizer

  model = models.build_model(cfg.model)
  fresh = scoring.init_params(model, jax.random.key(1), models.example_batch(cfg.model))
  start, pretrained = _flat(finetune.init_params(converted, fresh, "mlm")), _flat(bert.params)
  assert set(start) == set(pretrained) and any(k.startswith("['head']") for k in start)
  for k in start:
    np.testing.assert_array_equal(start[k], pretrained[k], err_msg=k)
  np.testing.assert_allclose(_first_logged_loss(lines),
                             _first_batch_loss(bert.model, bert.params, cfg, workdir), rtol=1e-5)


def test_a_converted_bert_that_does_not_fit_the_task_is_a_one_line_error(root, converted):
  """mlm.py:text as it is asks for rows of 128 tokens, BERT here has 32 positions: one line
  naming --init_from and the keys."""
  cd = _mlm_config(root, **{"data.max_source_len": 128, "data.max_target_len": 128})
  with pytest.raises(ConfigError, match=r"^--init_from=.*: data.max_source_len=128 and "
                                        r"data.max_target_len=128 must be <= model.max_len=32$"):
    finetune.init_from_config(from_configdict(cd), converted)
  cd = _mlm_config(root, **{"data.max_source_len": 128})  # only the key that is too long
  with pytest.raises(ConfigError, match=r"^--init_from=.*: data.max_source_len=128 must be <= "
                                        r"model.max_len=32$"):
    finetune.init_from_config(from_configdict(cd), converted)
