"""The coordinate check (transformer/train/coord_check.py) at small widths, with bounds: from
d_model 16 to 128 (m = 8), after 2 Adam steps, µP keeps every layer's mean |output| within 1.2x
while the standard parametrization grows the attention output and the logits."""

from transformer.train import coord_check


def _ratios(parametrization):
  batch = coord_check.random_batch(batch_size=2, length=16)
  return coord_check.check([16, 128], parametrization, batch, num_steps=2, layers=1, length=16,
                           learning_rate=2**-7)["ratios"]


def test_mup_is_flat_in_width_and_standard_is_not():
  """µP: every ratio (widest over narrowest) <= 1.2; standard: the largest >= 1.8 and the
  logits' >= 1.4, the embedding's ~ 8**-0.5 (its std is d_model**-0.5)."""
  mup, standard = _ratios("mup"), _ratios("standard")
  assert set(mup) == {"embedding", "layers_0/attention_logits", "layers_0/attention_output",
                      "layers_0/ffn_output", "layers_0/residual", "logits"}
  assert max(mup.values()) <= 1.2, mup
  assert max(standard.values()) >= 1.8, standard
  assert standard["logits"] >= 1.4, standard
  assert abs(standard["embedding"] - 8**-0.5) < 0.05, standard
