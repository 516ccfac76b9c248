"""Hugging Face ViT <-> workdir (transformer/convert/vit.py), checked against Hugging Face itself.

Offline: a tiny ViTForImageClassification (8x8 RGB images in 2x2 patches, 2 layers, d_model 32,
5 named labels) is built from a ViTConfig with every weight randomised (LayerNorm scales, biases,
the class token and position table too), saved with save_pretrained, converted, and its class
probabilities compared with Hugging Face's forward pass on the same pixels; again after a few
steps of training in torch; a bitwise round trip; and a ViT made here exported and read by
Hugging Face.
"""

import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import transformer  # noqa: E402
from transformer import convert  # noqa: E402
from transformer.config import from_configdict  # noqa: E402
from transformer.convert import vit  # noqa: E402
from transformer.data import images, tokenizers  # noqa: E402
from transformer.model import models, scoring  # noqa: E402

LABELS = ["cat", "dog", "tabby cat", "bird", "fish"]


def save_tiny_vit(directory: str, train_steps: int = 0):
  """Saves a random ViTForImageClassification (every weight perturbed; trained `train_steps`
  steps of AdamW on random images if > 0) in `directory`; returns the model."""
  config = transformers.ViTConfig(
      image_size=8, patch_size=2, num_channels=3, hidden_size=32, num_hidden_layers=2,
      num_attention_heads=4, intermediate_size=64, hidden_dropout_prob=0.0,
      attention_probs_dropout_prob=0.0, id2label=dict(enumerate(LABELS)),
      label2id={n: i for i, n in enumerate(LABELS)})
  torch.manual_seed(0)
  model = transformers.ViTForImageClassification(config).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.3 * torch.randn_like(p))
  if train_steps:
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    for _ in range(train_steps):
      pixels = torch.rand(8, 3, 8, 8, generator=gen) * 2 - 1
      labels = torch.randint(0, len(LABELS), (8,), generator=gen)
      opt.zero_grad()
      model(pixel_values=pixels, labels=labels).loss.backward()
      opt.step()
    model.eval()
  model.save_pretrained(directory)
  return model


def _pixels(n=6, seed=3):
  return np.random.default_rng(seed).random((n, 8, 8, 3)).astype(np.float32)  # in [0, 1]


def hf_probs(model, pixels01):
  """Hugging Face's class probabilities of images in [0, 1] (normalised as its processor does)."""
  nchw = torch.from_numpy(images.normalize(pixels01).transpose(0, 3, 1, 2).copy())
  with torch.no_grad():
    return torch.softmax(model(pixel_values=nchw).logits.double(), -1).numpy()


def our_probs(run, pixels01):
  """Our class probabilities: the softmax over the classes (ids NUM_SPECIAL on)."""
  logits = run._image_logits(pixels01)  # pylint: disable=protected-access
  full = np.asarray(jax.nn.softmax(logits.astype(np.float64), -1))
  np.testing.assert_array_equal(full[:, :tokenizers.NUM_SPECIAL], 0.0)  # reserved ids: never
  return full[:, tokenizers.NUM_SPECIAL:]


@pytest.mark.parametrize("train_steps", [0, 5], ids=["random", "trained"])
def test_converted_vit_classifies_like_hugging_face(tmp_path, train_steps):
  model = save_tiny_vit(str(tmp_path / "hf"), train_steps)
  cfg = convert.from_hf(str(tmp_path / "hf"), str(tmp_path / "run"))
  assert cfg.model.image_size == 8 and cfg.model.norm_eps == 1e-12 and cfg.model.max_len == 17
  run = transformer.restore(str(tmp_path / "run"))
  pixels = _pixels()
  want = hf_probs(model, pixels)
  np.testing.assert_allclose(our_probs(run, pixels), want, atol=1e-4)
  assert [run.classify(x)[0] for x in pixels] == [LABELS[i].replace(" ", "_")
                                                  for i in want.argmax(-1)]


def test_round_trip_is_bitwise(tmp_path):
  save_tiny_vit(str(tmp_path / "hf"))
  convert.from_hf(str(tmp_path / "hf"), str(tmp_path / "run"))
  hf = convert.to_hf(str(tmp_path / "run"), str(tmp_path / "back"))
  before, after = (convert.read_hf(str(tmp_path / d))[1] for d in ("hf", "back"))
  assert sorted(before) == sorted(after)
  for k in before:
    np.testing.assert_array_equal(after[k], before[k], err_msg=k)
  assert hf["id2label"] == {str(i): n.replace(" ", "_") for i, n in enumerate(LABELS)}


def test_a_vit_made_here_exports_to_hugging_face(tmp_path):
  """configs/vit.py's model (one channel, 10 digit classes) with random parameters, written as a
  workdir, exported: Hugging Face's probabilities are ours."""
  from configs import vit as vit_config  # pylint: disable=g-import-not-at-top
  c = vit_config.get_config("tiny")
  c.model.update(num_classes=14, vocab_size=1, dropout_rate=0.0)
  c.data.update(dataset="")
  cfg = from_configdict(c)
  model = models.build_model(cfg.model)
  params = scoring.init_params(model, jax.random.key(0), models.example_batch(cfg.model))
  keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(params))))
  params = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(next(keys), x.shape), params)
  labels = tokenizers.SymbolTokenizer([str(i) for i in range(10)])
  convert.write_workdir(cfg, params, labels, str(tmp_path / "run"))
  hf = convert.to_hf(str(tmp_path / "run"), str(tmp_path / "hf"))
  assert hf["num_channels"] == 1 and hf["id2label"]["3"] == "3"
  model = transformers.ViTForImageClassification.from_pretrained(str(tmp_path / "hf")).eval()
  run = transformer.restore(str(tmp_path / "run"))
  pixels = np.random.default_rng(0).random((5, 8, 8, 1)).astype(np.float32)
  logits = run._image_logits(pixels)[:, tokenizers.NUM_SPECIAL:]  # pylint: disable=protected-access
  ours = np.asarray(jax.nn.softmax(logits.astype(np.float64), -1))
  np.testing.assert_allclose(ours, hf_probs(model, pixels), atol=1e-4)


def test_unconvertible_vit_configs_are_one_line_errors(tmp_path):
  save_tiny_vit(str(tmp_path / "hf"))
  with pytest.raises(convert.ConvertError, match="qkv_bias=False has no counterpart"):
    vit.model_overrides({**convert.read_hf(str(tmp_path / "hf"))[0], "qkv_bias": False})
  with pytest.raises(convert.ConvertError, match="--text_file: a ViT reads images"):
    convert.from_hf(str(tmp_path / "hf"), str(tmp_path / "run"), text_file=__file__)
  assert not os.path.exists(tmp_path / "run" / "checkpoints")
