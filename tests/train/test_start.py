"""transformer/train/start.py's sized_config: a fine-tuned model's vocabulary against the task's
tokenizers, an image model's (which has no input tokenizer) included."""

import dataclasses
import types

import pytest

from configs import vit
from transformer.config import ConfigError, from_configdict
from transformer.data import tokenizers
from transformer.train import start


def _task(source, target):
  return types.SimpleNamespace(source_tokenizer=source, target_tokenizer=target)


def test_an_image_model_fine_tuned_with_init_from_has_no_input_tokenizer_to_check():
  """--init_from a converted ViT: the task reads images (no source tokenizer), its labels size the
  classes (this stopped with AttributeError on the missing tokenizer)."""
  cfg = from_configdict(vit.get_config("tiny"))
  labels = tokenizers.SymbolTokenizer([str(i) for i in range(10)])
  sized = start.sized_config(cfg, _task(None, labels), init_from="runs/vit_converted")
  assert sized.model.num_classes == labels.vocab_size


def test_a_tokenizer_larger_than_the_fine_tuned_table_is_named():
  """A text model's table must hold its tokenizer's ids: a ConfigError naming --init_from."""
  cfg = from_configdict(vit.get_config("tiny"))  # its encoder and head, reading tokens
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, image_size=0, vocab_size=5))
  words = tokenizers.SymbolTokenizer([f"w{i}" for i in range(10)])
  with pytest.raises(ConfigError, match=r"--init_from=runs/x: its model.vocab_size=5 is smaller"):
    start.sized_config(cfg, _task(words, words), init_from="runs/x")
