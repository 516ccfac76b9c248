"""The converter contract (transformer/convert/family.py): every family is a frozen `Family`,
declared as the last statement of its module and listed in FAMILIES; the driver reads its fields
and probes nothing; config.json model_types pick one family, and a model converted from a family
exports as that family again."""

import ast
import dataclasses
import inspect
import sys

import pytest

from transformer import convert
from transformer.config import model_config
from transformer.convert import family as family_lib

SIZES = {
    "gpt2": dict(vocab_size=50, n_positions=128, n_embd=8, n_layer=1, n_head=2),
    "t5": dict(vocab_size=50, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_heads=2),
    "bert": dict(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=16, max_position_embeddings=128),
    "llama": dict(vocab_size=50, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                  num_attention_heads=2, max_position_embeddings=128, hidden_act="silu"),
    "vit": dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                image_size=4, patch_size=2, num_channels=3),
}
CONFIGS = {"gpt2": SIZES["gpt2"], "t5": SIZES["t5"], "bert": SIZES["bert"],
           "llama": SIZES["llama"], "mistral": SIZES["llama"],
           "qwen2": SIZES["llama"] | dict(use_sliding_window=False),
           "mixtral": SIZES["llama"] | dict(num_local_experts=2, num_experts_per_tok=1),
           "vit": SIZES["vit"]}


def test_every_family_is_a_frozen_family_ending_its_module():
  """FAMILIES holds one frozen Family per module, assigned to FAMILY by the module's last
  statement; its `module` names that module."""
  assert len({f.module for f in convert.FAMILIES}) == len(convert.FAMILIES)
  for family in convert.FAMILIES:
    assert isinstance(family, family_lib.Family)
    with pytest.raises(dataclasses.FrozenInstanceError):
      family.name = "other"  # type: ignore[misc]
    module = sys.modules[family.module]
    assert module.FAMILY is family
    last = ast.parse(inspect.getsource(module)).body[-1]
    assert isinstance(last, ast.Assign) and last.targets[0].id == "FAMILY", family.module


def test_the_driver_probes_no_module():
  """transformer/convert/__init__.py reads Family fields: no getattr or hasattr."""
  tree = ast.parse(inspect.getsource(convert))
  called = {node.func.id for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
  assert not called & {"getattr", "hasattr"}


def test_model_types_pick_one_family_each():
  kinds = [kind for family in convert.FAMILIES for kind in family.model_types]
  assert len(kinds) == len(set(kinds))
  with pytest.raises(convert.ConvertError, match="model_type='roberta' is not supported"):
    convert.family_of_hf({"model_type": "roberta"})


@pytest.mark.parametrize("kind", CONFIGS)
def test_a_converted_model_exports_as_its_family(kind):
  """The model config of a config.json of each model_type exports as the family that read it
  (the families of one architecture are disjoint)."""
  hf = dict(model_type=kind, **CONFIGS[kind])
  family = convert.family_of_hf(hf)
  m = model_config(**family.model_overrides(hf, None))
  assert convert.export_family(m) is family
  assert convert.family_of_config(m) is sys.modules[family.module]
  assert family.hf_config(m, hf)["model_type"] == kind
