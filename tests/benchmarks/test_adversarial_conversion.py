"""benchmarks/adversarial_conversion.py: its rows reach the campaign, and its setups stage what
they name (on a stand-in Hugging Face directory, no torch): the edited tensor, tokenizer.json's
swapped specials, the sharded index, and a --from_hf command on the case's own copy."""

import json
import os
import sys
import types

import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import adversarial  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
import adversarial_conversion as conv  # noqa: E402  pylint: disable=g-import-not-at-top


def _ctx(tmp_path):
  """A case directory under a campaign root whose hf_sources/llama is a stand-in model."""
  source = tmp_path / "hf_sources" / "llama"
  source.mkdir(parents=True)
  (source / "config.json").write_text(json.dumps({"model_type": "llama", "bos_token_id": 1}))
  (source / "tokenizer.json").write_text(json.dumps({
      "model": {"vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3}},
      "added_tokens": [{"id": i, "content": t, "special": True}
                       for i, t in enumerate(["<unk>", "<s>", "</s>"])]}))
  safetensors_numpy.save_file({conv.TENSOR: np.ones((4, 6), np.float32)},
                              str(source / "model.safetensors"))
  case = tmp_path / "cases" / "a_case"
  case.mkdir(parents=True)
  return types.SimpleNamespace(dir=str(case), run=str(case / "run"), config="")


def test_every_row_is_a_campaign_case():
  names = {c.name for c in adversarial.CASES}
  assert {row[0] for row in conv.CASES} <= names and len(conv.CASES) >= 14
  assert all(row[4] for row in conv.CASES if row[2] == "clear error")  # each names its culprit


def test_setups_stage_what_they_name(tmp_path):
  ctx = _ctx(tmp_path)
  argv = conv.convert_with("llama", tensors=conv._narrower(conv.TENSOR))(ctx)  # pylint: disable=protected-access
  copy = os.path.join(ctx.dir, "hf_llama")
  assert argv[-2:] == [f"--from_hf={copy}", f"--workdir={ctx.dir}/converted"]
  assert safetensors_numpy.load_file(os.path.join(copy, "model.safetensors"))[
      conv.TENSOR].shape == (4, 5)
  assert conv._nothing_written(ctx, None)  # pylint: disable=protected-access

  ctx = _ctx(tmp_path / "swapped")
  conv.convert_with("llama", files=conv._tokenizer(conv._swap_bos_eos))(ctx)  # pylint: disable=protected-access
  spec = json.loads(open(os.path.join(ctx.dir, "hf_llama", "tokenizer.json")).read())
  assert spec["model"]["vocab"]["</s>"] == 1 and spec["added_tokens"][2] == {
      "id": 1, "content": "</s>", "special": True}

  ctx = _ctx(tmp_path / "sharded")
  conv.convert_with("llama", files=conv._sharded)(ctx)  # pylint: disable=protected-access
  assert sorted(os.listdir(os.path.join(ctx.dir, "hf_llama"))) == [
      "config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
      "tokenizer.json"]
