"""Attention maps of a ViT (transformer/infer/api.py, viz.py): the rollout against a NumPy loop
over layers and entries, and the figure of a map over its image."""

import numpy as np
import pytest

from transformer.infer import api, viz


def _naive_rollout(layers):
  out = np.eye(layers[0].shape[-1])
  for w in layers:
    t = w.shape[-1]
    mean = [[sum(w[h, i, j] for h in range(w.shape[0])) / w.shape[0] for j in range(t)]
            for i in range(t)]
    mixed = np.array([[0.5 * mean[i][j] + 0.5 * (i == j) for j in range(t)] for i in range(t)])
    out = (mixed / mixed.sum(1, keepdims=True)) @ out
  return out


def test_rollout_is_the_product_of_residual_mixed_head_means():
  rng = np.random.default_rng(0)
  layers = [rng.dirichlet(np.ones(5), size=(3, 5)) for _ in range(4)]  # [heads, t, t] rows sum 1
  rollout = api.attention_rollout(layers)
  np.testing.assert_allclose(rollout, _naive_rollout(layers), atol=1e-12)
  np.testing.assert_allclose(rollout.sum(1), 1.0, atol=1e-12)


def test_rollout_known_answers():
  """Worked by hand (t = 3, residual mixing 0.5 A + 0.5 I): identity attention rolls out to the
  identity; a first layer whose heads all read token 0 and a second whose heads all read token 1
  give rows 0.5 e0 + 0.25 e1 + 0.25 e_i (the other order would give 0.25 e0 + 0.5 e1 + 0.25 e_i)."""
  eye = np.eye(3)[None].repeat(2, 0)  # [heads, t, t]
  np.testing.assert_allclose(api.attention_rollout([eye, eye]), np.eye(3), atol=1e-12)
  to = lambda j: np.tile(np.eye(3)[j], (2, 3, 1))  # every head, every query -> token j
  want = np.array([[0.75, 0.25, 0.0], [0.5, 0.5, 0.0], [0.5, 0.25, 0.25]])
  np.testing.assert_allclose(api.attention_rollout([to(0), to(1)]), want, atol=1e-12)


def test_image_attention_figure(tmp_path):
  image = np.random.default_rng(0).random((8, 8, 1))
  fig = viz.plot_image_attention(image, np.arange(16.0).reshape(4, 4),
                                 save_path=str(tmp_path / "a.png"))
  assert len(fig.axes) == 2 and (tmp_path / "a.png").stat().st_size > 1000
  with pytest.raises(ValueError, match=r"a map \(3, 3\) does not tile an image \(8, 8\)"):
    viz.plot_image_attention(image, np.ones((3, 3)))
