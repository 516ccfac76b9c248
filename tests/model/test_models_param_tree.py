"""The parameter trees of the main configs (paths, shapes, dtypes, logical axis names) are the ones
recorded in param_trees.json: checkpoints, restores and the Hugging Face converters read parameters
by these paths, so a refactoring of the model code must leave them as they are.

A deliberate change of the tree rewrites the record: `python tests/model/test_models_param_tree.py
--write` (from the repository root, with the tree to record first on PYTHONPATH)."""

import json
import pathlib
import sys

import flax.linen as nn
import jax
import pytest

from configs import base, g2p, lm, mlm, vit
from transformer.config import from_configdict
from transformer.model.models import batch_init, build_model, example_batch

RECORD = pathlib.Path(__file__).with_name("param_trees.json")


def _configs() -> dict:
  """name -> ConfigDict: G2P's default, nanoGPT-CPU and its MoE twin, two encoder-decoders (GQA,
  scanned layers, RoPE, RMSNorm, SwiGLU; split key/value heads, relative bias, untied), BERT-like
  masked LM, ViT."""
  out = {}
  c = g2p.get_config()
  c.model.update(vocab_size=50, source_vocab_size=40)
  out["g2p_base"] = c
  for variant in ("nanogpt_cpu", "moe"):
    c = lm.get_config(variant)
    c.model.update(vocab_size=65)
    out[f"lm_{variant}"] = c
  small = dict(vocab_size=64, num_encoder_layers=2, num_decoder_layers=2, d_model=64,
               num_heads=4, mlp_dim=128, num_kv_heads=2)
  c = base.get_config()
  c.model.update(small, source_vocab_size=64, scan_layers=True, positional="rope", norm="rmsnorm",
                 ffn="swiglu")
  out["encdec_gqa_scan"] = c
  c = base.get_config()
  c.model.update(small, source_vocab_size=48, head_dim=16, v_head_dim=8, positional="relative",
                 tie_embeddings=False, share_src_tgt_embeddings=False)
  out["encdec_kv_split"] = c
  c = mlm.get_config("cmudict")
  c.model.update(vocab_size=40)
  out["mlm_cmudict"] = c
  c = vit.get_config("default")
  c.model.update(vocab_size=1, num_classes=10)
  out["vit_default"] = c
  return out


def param_tree(cd) -> dict[str, list]:
  """'path/to/param' -> [shape, dtype, logical axis names] of a config's initialised model."""
  cfg = from_configdict(cd).model
  shapes = jax.eval_shape(lambda: batch_init(build_model(cfg), {"params": jax.random.key(0)},
                                             example_batch(cfg)))["params"]
  is_box = lambda leaf: isinstance(leaf, nn.LogicallyPartitioned)
  tree = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(shapes, is_leaf=is_box)[0]:
    value = leaf.value if is_box(leaf) else leaf
    names = list(leaf.names) if is_box(leaf) else None
    tree["/".join(str(k.key) for k in path)] = [list(value.shape), str(value.dtype), names]
  return tree


@pytest.mark.parametrize("name", sorted(_configs()))
def test_param_tree_is_the_recorded_one(name):
  """Every path, shape, dtype and logical axis name as recorded."""
  want = json.loads(RECORD.read_text())[name]
  got = param_tree(_configs()[name])
  assert sorted(got) == sorted(want), f"{name}: paths differ"
  for path, entry in want.items():
    assert got[path] == entry, (name, path)


if __name__ == "__main__":
  if sys.argv[1:] != ["--write"]:
    raise SystemExit(__doc__)
  trees = {name: param_tree(cd) for name, cd in sorted(_configs().items())}
  lines = ",\n".join(
      f"{json.dumps(name)}: {{\n" + ",\n".join(
          f"  {json.dumps(path)}: {json.dumps(entry)}" for path, entry in sorted(tree.items()))
      + "\n}" for name, tree in trees.items())
  RECORD.write_text("{\n" + lines + "\n}\n")
