"""What every conversion checks of what it reads (transformer/convert/checks.py, run by
common.params_of for every family): a config with fewer layers than the weights, a tensor of
another shape, a tensor no parameter reads, a non-finite tensor, a sharded or foreign checkpoint,
special-token ids outside the vocabulary or on tokens that tokenizer.json (or
tokenizer_config.json) does not give that role, an unreadable tokenizer.json, and on export a
non-finite parameter. Each is one line naming the tensor or key, exit 1, and nothing written.

Offline: each family's tiny random Hugging Face model as its own test module builds it
(test_gpt2's tokenizer, test_t5's, test_bert's, test_llama's, test_mixtral's, test_vit's),
saved once; every case edits a copy of its config.json or model.safetensors.
"""

import json
import os
import shutil

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

import transformer  # noqa: E402
from transformer import convert  # noqa: E402
from transformer.convert import llama  # noqa: E402
import test_bert  # noqa: E402
import test_gpt2  # noqa: E402
import test_llama  # noqa: E402
import test_mixtral  # noqa: E402
import test_t5  # noqa: E402
import test_vit  # noqa: E402

# family -> (its config.json's layer count key, the prefix of its layer 1's tensors)
LAYERS = {"gpt2": ("n_layer", "h.1."), "t5": ("num_layers", "encoder.block.1."),
          "bert": ("num_hidden_layers", "bert.encoder.layer.1."),
          "llama": ("num_hidden_layers", "model.layers.1."),
          "mixtral": ("num_hidden_layers", "model.layers.1."),
          "vit": ("num_hidden_layers", "vit.encoder.layer.1.")}


def _save_gpt2(directory):
  tok = test_gpt2.tiny_tokenizer(test_gpt2.corpus())
  eot = tok.token_to_id(test_gpt2.EOT)
  torch.manual_seed(0)
  transformers.GPT2LMHeadModel(transformers.GPT2Config(
      vocab_size=tok.get_vocab_size(), n_positions=32, n_embd=32, n_layer=2, n_head=4,
      bos_token_id=eot, eos_token_id=eot)).save_pretrained(directory)
  tok.save(os.path.join(directory, "tokenizer.json"))


def _save_t5(directory):
  test_t5.hf_model("flan").save_pretrained(directory)
  test_t5.tiny_tokenizer().save(os.path.join(directory, "tokenizer.json"))


def _save_decoder(module):
  def save(directory):
    torch.manual_seed(0)
    tok = test_llama.tokenizer()
    variant = "llama2" if module is test_llama else "mixtral"
    module.hf_model(variant, tok.get_vocab_size()).save_pretrained(directory)
    tok.save(os.path.join(directory, "tokenizer.json"))
  return save


SAVE = {"gpt2": _save_gpt2, "t5": _save_t5, "bert": test_bert.save_tiny_bert,
        "llama": _save_decoder(test_llama), "mixtral": _save_decoder(test_mixtral),
        "vit": test_vit.save_tiny_vit}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """family -> the directory of its tiny saved model, each built once."""
  root, cache = tmp_path_factory.mktemp("checks"), {}

  def get(family: str) -> str:
    if family not in cache:
      cache[family] = str(root / family)
      SAVE[family](cache[family])
    return cache[family]

  return get


def edited(source: str, target, config=None, state=None) -> str:
  """A copy of the Hugging Face directory `source` at `target`, `config(dict)` and
  `state(dict)` applied to its config.json and model.safetensors (each edits in place)."""
  shutil.copytree(source, target)
  if config is not None:
    hf = json.loads((target / "config.json").read_text())
    config(hf)
    (target / "config.json").write_text(json.dumps(hf))
  if state is not None:
    tensors = safetensors_numpy.load_file(str(target / "model.safetensors"))
    state(tensors)
    safetensors_numpy.save_file(tensors, str(target / "model.safetensors"))
  return str(target)


def refused(directory: str, tmp_path, capsys) -> str:
  """The one error line of `--from_hf=directory`, which must exit 1 and write no run."""
  workdir = tmp_path / "out"
  capsys.readouterr()  # what saving the model printed
  assert convert.main([f"--from_hf={directory}", f"--workdir={workdir}"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1, err
  assert not (workdir / "config.json").exists() and not (workdir / "checkpoints").exists()
  return err[0]


@pytest.mark.parametrize("family", LAYERS)
def test_a_config_with_fewer_layers_than_the_weights_names_the_layer_left_over(
    family, saved, tmp_path, capsys):
  """config.json says one layer fewer than the weights hold: the conversion is refused naming a
  tensor of the layer it would drop (it used to convert without it, silently)."""
  key, prefix = LAYERS[family]
  directory = edited(saved(family), tmp_path / "hf", config=lambda hf: hf.update({key: 1}))
  err = refused(directory, tmp_path, capsys)
  assert f"weights hold {prefix}" in err and "more layers than config.json says" in err, err


@pytest.mark.parametrize("family", LAYERS)
def test_a_non_finite_tensor_is_named(family, saved, tmp_path, capsys):
  """One NaN in a tensor of layer 1: the conversion is refused naming that tensor (it used to
  convert, then evaluate to a null loss with exit 0)."""
  _, prefix = LAYERS[family]
  poisoned = []

  def poison(state):
    name = sorted(k for k in state if k.removeprefix("transformer.").startswith(prefix)
                  and k.endswith("weight"))[0]
    state[name] = state[name].copy()
    state[name].flat[3] = np.nan
    poisoned.append(name)

  directory = edited(saved(family), tmp_path / "hf", state=poison)
  err = refused(directory, tmp_path, capsys)
  assert poisoned[0].removeprefix("transformer.") in err and "non-finite" in err, err


def test_a_tensor_of_another_shape_is_named_with_both_shapes(saved, tmp_path, capsys):
  """config.json's intermediate_size is not the weights': the first tensor it sizes is named,
  with its shape and the config's."""
  directory = edited(saved("llama"), tmp_path / "hf",
                     config=lambda hf: hf.update(intermediate_size=80))
  err = refused(directory, tmp_path, capsys)
  assert ("model.layers.0.mlp.gate_proj.weight has shape (96, 64), config.json's sizes give "
          "(80, 64)") in err, err


def test_a_tensor_no_parameter_reads_is_named(saved, tmp_path, capsys):
  """A tensor the family has no place for (another head) is named, not dropped."""
  directory = edited(saved("bert"), tmp_path / "hf", state=lambda state: state.update(
      {"cls.extra_head.weight": np.ones((2, 32), np.float32)}))
  assert "weights hold cls.extra_head.weight, which" in refused(directory, tmp_path, capsys)


def test_tensors_the_family_drops_by_design_still_convert(saved, tmp_path):
  """Buffers and copies older files hold (Llama's rotary inv_freq, a tied head's lm_head equal
  to the embedding) are the family's `unused`: the conversion goes on."""
  def add(state):
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)
  directory = edited(saved("llama"), tmp_path / "hf", state=add)
  convert.from_hf(directory, str(tmp_path / "out"))
  assert (tmp_path / "out" / "config.json").exists()


def test_sharded_and_foreign_checkpoints_are_said_plainly(saved, tmp_path, capsys):
  """A sharded checkpoint (an index and its shards) or a TensorFlow file is named as what it is."""
  directory = tmp_path / "sharded"
  shutil.copytree(saved("llama"), directory)
  os.rename(directory / "model.safetensors", directory / "model-00001-of-00001.safetensors")
  (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
  err = refused(str(directory), tmp_path, capsys)
  assert "model.safetensors.index.json (a sharded safetensors checkpoint)" in err, err
  tf = tmp_path / "tf"
  shutil.copytree(saved("gpt2"), tf)
  os.rename(tf / "model.safetensors", tf / "tf_model.h5")
  assert "tf_model.h5 (a TensorFlow checkpoint), which is not read" in refused(str(tf), tmp_path,
                                                                                 capsys)


@pytest.mark.parametrize("key,value", [("eos_token_id", 5000), ("bos_token_id", -1),
                                       ("eos_token_id", [2, 7000])])
def test_special_token_ids_outside_the_vocabulary_are_named(saved, tmp_path, capsys, key, value):
  """A BOS/EOS id that neither tokenizer.json nor the weights have is named (it used to map
  nothing to our EOS, silently)."""
  directory = edited(saved("llama"), tmp_path / "hf", config=lambda hf: hf.update({key: value}))
  assert f"config.json: {key}={value!r} is not an id" in refused(directory, tmp_path, capsys)


def test_export_of_a_non_finite_parameter_is_refused_naming_it(saved, tmp_path, capsys):
  """A run whose parameters hold a NaN (a diverged fine-tune) exports nothing: one line naming
  the parameter."""
  convert.from_hf(saved("llama"), str(tmp_path / "run"))
  run = transformer.restore(str(tmp_path / "run"))

  def poison(path, x):
    x = np.array(x)
    if jax.tree_util.keystr(path) == "['decoder']['layers_1']['ffn']['wo']['kernel']":
      x[0, 0] = np.inf
    return x

  params = jax.tree_util.tree_map_with_path(poison, run.params)
  with pytest.raises(convert.ConvertError, match=r"parameter decoder.layers_1.ffn.wo.kernel "
                     r"holds 1 non-finite value"):
    llama.hf_from_params(params, run.config.model, None)
  convert.write_workdir(run.config, params, run.target_tokenizer, str(tmp_path / "bad"))
  capsys.readouterr()
  assert convert.main([f"--workdir={tmp_path / 'bad'}", f"--to_hf={tmp_path / 'hf'}"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "decoder.layers_1.ffn.wo.kernel" in err[0], err
  assert not (tmp_path / "hf" / "model.safetensors").exists()


def _edit_json(path, edit) -> None:
  data = json.loads(path.read_text())
  edit(data)
  path.write_text(json.dumps(data))


def _swap_bos_eos(spec) -> None:
  vocab, added = spec["model"]["vocab"], {t["content"]: t for t in spec["added_tokens"]}
  vocab["<s>"], vocab["</s>"] = vocab["</s>"], vocab["<s>"]
  added["<s>"]["id"], added["</s>"]["id"] = added["</s>"]["id"], added["<s>"]["id"]


def test_special_token_ids_on_tokens_of_another_role_are_named(saved, tmp_path, capsys):
  """config.json's ids against tokenizer.json's special tokens (they used to convert silently,
  our EOS then an ordinary word): an EOS id on an ordinary token; <s> and </s> swapped in
  tokenizer.json; tokenizer_config.json naming another EOS than config.json's."""
  ordinary = edited(saved("gpt2"), tmp_path / "ordinary", config=lambda hf: hf.update(
      eos_token_id=9))
  err = refused(ordinary, tmp_path, capsys)
  assert "config.json: eos_token_id=9, but tokenizer.json's id 9 is" in err, err
  assert "not one of its special tokens" in err, err
  swapped = edited(saved("llama"), tmp_path / "swapped")
  _edit_json(tmp_path / "swapped" / "tokenizer.json", _swap_bos_eos)
  assert ("bos_token_id=1, but tokenizer.json's id 1 is '</s>', no BOS token"
          in refused(swapped, tmp_path, capsys))
  named = edited(saved("llama"), tmp_path / "named")
  (tmp_path / "named" / "tokenizer_config.json").write_text(json.dumps(
      {"bos_token": {"content": "<s>"}, "eos_token": "<unk>"}))
  assert ("eos_token_id=2, but tokenizer_config.json's eos_token '<unk>' is id 0"
          in refused(named, tmp_path, capsys))


@pytest.mark.parametrize("family", ["gpt2", "t5", "bert", "llama", "mixtral"])
def test_every_familys_own_special_tokens_pass(family, saved):
  """The check reads each family's real layout (GPT-2's one <|endoftext|>, T5's <pad> </s>,
  BERT's [PAD], Llama's <s> </s>) as agreeing."""
  from transformer.convert import checks  # pylint: disable=g-import-not-at-top
  from transformer.data import tokenizers  # pylint: disable=g-import-not-at-top
  directory = saved(family)
  hf = json.loads(open(os.path.join(directory, "config.json")).read())
  checks.check_special_tokens(hf, tokenizers.read_hf_tokenizer(directory), {
      "bos_token": "<s>", "eos_token": {"content": "</s>"}} if family == "llama" else None)


def test_a_tokenizer_json_that_is_no_tokenizer_is_named(saved, tmp_path, capsys):
  """tokenizer.json holding JSON that `tokenizers` cannot read (a traceback before)."""
  directory = edited(saved("bert"), tmp_path / "hf")
  (tmp_path / "hf" / "tokenizer.json").write_text("{}")
  err = refused(directory, tmp_path, capsys)
  assert "tokenizer.json: not a Hugging Face tokenizers tokenizer.json (" in err, err
