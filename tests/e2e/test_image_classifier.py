"""A ViT end to end: `train.py --config=configs/vit.py:tiny` for a few steps, `eval.py` on the
test split (accuracy and a confusion matrix that agree with each other and with
`restore(...).classify` on the same images), and the attention maps of the trained run
(rollout against a NumPy loop, a row of probabilities over the patches, the figure)."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import transformer
from transformer.infer import api, viz

# ~60 s: two subprocesses. The parts are fast-tested apart: tests/model/test_models_images.py
# (the model), tests/data/test_images.py (the data), tests/infer/test_image_attention.py (rollout,
# the figure), tests/convert/test_vit.py (Hugging Face).
pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 30


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A workdir of configs/vit.py:tiny trained STEPS steps by train.py, evaluated by eval.py."""
  workdir = str(tmp_path_factory.mktemp("vit") / "run")
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  outputs = []
  for command in (
      ["train.py", "--config=configs/vit.py:tiny", f"--workdir={workdir}",
       f"--config.train.num_steps={STEPS}", "--config.eval.every_steps=15",
       "--config.checkpoint.every_steps=15", "--config.train.warmup_steps=10"],
      ["eval.py", f"--workdir={workdir}", "--split=test", "--step=best"]):
    proc = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs.append(proc.stdout)
  assert "confusion matrix" in proc.stdout
  assert re.search(r"^scored +359 of 359 examples \(the whole split\)$", proc.stdout, re.M), \
      proc.stdout  # one label per image, not "tokens"
  # train.py's closing lines point an image classifier to Python's classify, not to predict.
  assert f"transformer.restore({workdir!r}).classify(pixels)" in outputs[0]
  assert "infer.predict" not in outputs[0]
  return workdir


def test_eval_reports_accuracy_and_a_consistent_confusion_matrix(trained):
  with open(os.path.join(trained, "metrics.test.json"), encoding="utf-8") as f:
    results = json.load(f)
  counts = np.array(results["confusion_matrix"]["counts"])
  assert results["classes"] == [str(i) for i in range(10)] and counts.shape == (10, 10)
  assert counts.sum() == 359  # every test image, each predicted as one of the classes
  assert results["accuracy"] == pytest.approx(np.trace(counts) / 359)
  run = transformer.restore(trained, step="best")
  pixels, labels = run.task.split("test")
  np.testing.assert_array_equal(counts.sum(1), np.bincount(labels, minlength=10))
  predicted = np.array([int(p) for p in run.classify(pixels)])
  assert np.mean(predicted == labels) == pytest.approx(results["accuracy"])
  one = run.classify_with_probability(pixels[3, :, :, 0])  # [H, W]: one channel
  assert one[0][0] == str(predicted[3]) and 0 < one[0][1] <= 1
  with pytest.raises(ValueError, match=r"images of shape \(5, 5\): this run takes an image"):
    run.classify(np.zeros((5, 5)))
  with pytest.raises(ValueError, match=r"classifies images \(model.image_size=8\): give arrays of "
                     "pixels, not text"):
    run.classify(["hello"])


def _naive_rollout(layers):
  out = np.eye(layers[0].shape[-1])
  for w in layers:
    a = w.mean(0)
    t = a.shape[0]
    mixed = np.array([[0.5 * a[i, j] + 0.5 * (i == j) for j in range(t)] for i in range(t)])
    mixed = mixed / mixed.sum(1, keepdims=True)
    out = mixed @ out
  return out


def test_attention_maps_of_the_class_token(trained, tmp_path):
  run = transformer.restore(trained, step="best")
  pixels, _ = run.task.split("test")
  att = run.attention(pixels[0])
  assert len(att.encoder_self) == 4 and att.encoder_self[0].shape == (4, 17, 17)
  assert att.source_tokens[0] == "<cls>" and len(att.source_tokens) == 17
  rollout = api.attention_rollout(att.encoder_self)
  np.testing.assert_allclose(rollout, _naive_rollout(att.encoder_self), atol=1e-6)
  np.testing.assert_allclose(rollout.sum(1), 1.0, atol=1e-9)
  amap = transformer.image_attention_map(run, pixels[0])
  np.testing.assert_allclose(amap.ravel(), rollout[0, 1:])
  last = transformer.image_attention_map(run, pixels[0], method="last")
  np.testing.assert_allclose(last.ravel(), att.encoder_self[-1].mean(0)[0, 1:], rtol=1e-6)
  assert amap.shape == (4, 4) and 0 < amap.sum() < 1  # the rest stays on the class token
  viz.plot_image_attention(pixels[0], amap, save_path=str(tmp_path / "vit.png"))
  assert (tmp_path / "vit.png").stat().st_size > 1000
