"""`train.py --init_from` for encoder-only fine-tuning (checkpoints.init_from_config, init_params
with a fresh tree, shared_params): the pretrained encoder and embeddings load exactly, the new
head is freshly initialised, and mismatched parameters are one line naming them."""

import dataclasses

import jax
import numpy as np
import pytest

from transformer import checkpoints, models, steps
from transformer.config import ConfigError, from_configdict
from transformer.training import train_and_evaluate
import encoder_fixtures


def _flat(tree):
  return {jax.tree_util.keystr(k): np.asarray(v) for k, v in
          jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("mlm")
  workdir = str(root / "mlm")
  train_and_evaluate(encoder_fixtures.config(str(root / "data"), "mlm", num_steps=4), workdir)
  return root, workdir


def test_fine_tuning_loads_exactly_the_shared_weights(mlm_run):
  """Leaf by leaf: every encoder and embedding parameter of the classifier equals the MLM run's,
  the head's equal a fresh init's, and nothing else exists; then a real fine-tuning run from it
  trains with the pretrained run's input tokenizer and vocabulary."""
  root, workdir = mlm_run
  pretrained = _flat(checkpoints.restore_params(checkpoints.load_run_config(workdir), workdir)[0])
  cfg = checkpoints.init_from_config(
      from_configdict(encoder_fixtures.config(str(root / "data"), "classify")), workdir)
  assert cfg.model.head == "classify" and cfg.model.vocab_size > 0  # the run's vocabulary
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, num_classes=7))
  model = models.build_model(cfg.model)
  fresh = steps.init_params(model, jax.random.key(1), models.example_batch(cfg.model))
  loaded = _flat(checkpoints.init_params(workdir, fresh))
  fresh = _flat(fresh)
  assert set(loaded) == set(fresh)
  heads = {k for k in loaded if k.startswith("['head']")}
  assert heads == {"['head']['classifier']['kernel']"}
  for k in loaded:
    np.testing.assert_array_equal(loaded[k], fresh[k] if k in heads else pretrained[k])
  assert set(pretrained) == set(loaded) - heads  # the tied MLM run has no head of its own
  result = train_and_evaluate(encoder_fixtures.config(str(root / "data"), "classify", num_steps=2),
                              str(root / "tuned"), init_from=workdir)
  assert np.isfinite(result["eval/accuracy"]) and "eval/f1" in result


def test_mismatched_parameters_are_one_line_naming_them():
  """A missing leaf and a leaf of another shape are both named in one ConfigError line."""
  fresh = {"token_embed": {"embedding": np.zeros((9, 4))},
           "encoder": {"layers_0": {"w": np.zeros((4, 4)), "b": np.zeros(4)}},
           "head": {"classifier": {"kernel": np.zeros((4, 3))}}}
  pretrained = {"token_embed": {"embedding": np.zeros((8, 4))},
                "encoder": {"layers_0": {"w": np.zeros((4, 4))}}}
  with pytest.raises(ConfigError) as e:
    checkpoints.shared_params(pretrained, fresh, "runs/mlm")
  message = str(e.value)
  assert "\n" not in message and "--init_from=runs/mlm" in message
  assert "missing in the run: encoder/layers_0/b" in message
  assert "shapes differ: token_embed/embedding" in message
