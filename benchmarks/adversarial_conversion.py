"""The adversarial campaign's cases on Hugging Face conversion and export, for every family
(GPT-2, Llama, Mistral, Qwen2, Mixtral, BERT, T5, ViT): a config.json that disagrees with its
tensors, a tensor of another shape, missing or left over, non-finite weights, checkpoint formats
that are not read, special-token ids a tokenizer.json does not hold, unreadable files, writes
into a run's workdir or over a user's file, and exports of fine-tuned and resumed runs that must
round-trip bitwise. Each function stages its case in `ctx` (benchmarks/adversarial.py's Context:
`dir`, `run`, `config`) and returns the command's argv; `CASES` holds their rows as data, read
by adversarial.py.

The tiny random Hugging Face models are the conversion tests' own (tests/convert/), built once
per campaign directory under hf_sources/ by a subprocess (torch stays out of the campaign's
process) and copied into each case's directory.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import subprocess
import sys

PY = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Saves family sys.argv[1]'s tiny model (and tokenizer.json) in directory sys.argv[2].
_BUILD = """\
import os, sys
sys.path[:0] = [os.path.join(os.getcwd(), 'tests'), os.path.join(os.getcwd(), 'tests', 'convert')]
import torch
import test_convert_checks, test_llama
family, out = sys.argv[1:]
if family in ('mistral', 'qwen2'):
  torch.manual_seed(0)
  tok = test_llama.tokenizer()
  test_llama.hf_model(family, tok.get_vocab_size()).save_pretrained(out)
  tok.save(os.path.join(out, 'tokenizer.json'))
elif family == 'vit_digits':  # configs/vit.py's images: 8x8, one channel, ten digits
  import transformers
  torch.manual_seed(0)
  transformers.ViTForImageClassification(transformers.ViTConfig(
      image_size=8, patch_size=2, num_channels=1, hidden_size=32, num_hidden_layers=2,
      num_attention_heads=4, intermediate_size=64, id2label={i: str(i) for i in range(10)},
      label2id={str(i): i for i in range(10)})).save_pretrained(out)
else:
  test_convert_checks.SAVE[family](out)
"""


def _env() -> dict[str, str]:
  return dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")


def _hf(ctx, family: str) -> str:
  """A copy, in the case's directory, of `family`'s tiny Hugging Face model (built once)."""
  cache = os.path.join(os.path.dirname(os.path.dirname(ctx.dir)), "hf_sources", family)
  if not os.path.exists(cache):
    partial = f"{cache}.partial{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    done = subprocess.run([PY, "-c", _BUILD, family, partial], cwd=REPO, env=_env(), text=True,
                          capture_output=True, check=False, timeout=300)
    if done.returncode != 0:
      raise RuntimeError(f"building {family}: {(done.stderr.strip().splitlines() or [''])[-1]}")
    os.replace(partial, cache)
  target = os.path.join(ctx.dir, f"hf_{family}")
  shutil.copytree(cache, target)
  return target


def _from_hf(source: str, workdir: str, *flags: str) -> list[str]:
  return [PY, "-m", "transformer.convert", f"--from_hf={source}", f"--workdir={workdir}", *flags]


def _to_hf(workdir: str, out: str, *flags: str) -> list[str]:
  return [PY, "-m", "transformer.convert", f"--workdir={workdir}", f"--to_hf={out}", *flags]


def _staged(argv: list[str]) -> None:
  """Runs a staging command (not the case's); a failure is the case's staging failure."""
  done = subprocess.run(argv, cwd=REPO, env=_env(), text=True, capture_output=True, check=False,
                        timeout=300)
  if done.returncode != 0:
    raise RuntimeError(f"{shlex.join(argv[:4])}: {(done.stderr.strip().splitlines() or [''])[-1]}")


def _edit_config(directory: str, change) -> None:
  path = os.path.join(directory, "config.json")
  with open(path) as f:
    hf = json.load(f)
  change(hf)
  with open(path, "w") as f:
    json.dump(hf, f)


def _edit_tensors(directory: str, change) -> None:
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  path = os.path.join(directory, "model.safetensors")
  state = load_file(path)
  change(state)
  save_file(state, path)


def _convert(ctx, family: str, config=None, tensors=None, files=None):
  """The case's command: --from_hf of `family`'s model with `config` (config.json dict),
  `tensors` (the state dict) and `files` (the directory) changed in place."""
  directory = _hf(ctx, family)
  if config is not None:
    _edit_config(directory, config)
  if tensors is not None:
    _edit_tensors(directory, tensors)
  if files is not None:
    files(directory)
  return _from_hf(directory, os.path.join(ctx.dir, "converted"))


def convert_with(family: str, config=None, tensors=None, files=None):
  """A case's setup: --from_hf of `family`'s model, edited as `_convert` says."""
  return lambda ctx: _convert(ctx, family, config, tensors, files)


def _layers(key: str, delta: int):
  return lambda hf: hf.update({key: hf[key] + delta})


def _narrower(name: str):
  def change(state):
    state[name] = state[name][:, :-1].copy()
  return change


def _poison(name: str, value: float):
  def change(state):
    state[name] = state[name].copy()
    state[name].flat[1] = value
  return change


def _rename_weights(to: str):
  return lambda d: os.rename(os.path.join(d, "model.safetensors"), os.path.join(d, to))


def _sharded(d: str) -> None:
  os.rename(os.path.join(d, "model.safetensors"),
            os.path.join(d, "model-00001-of-00002.safetensors"))
  with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}},
              f)


def _tokenizer(edit):
  def change(d: str) -> None:
    path = os.path.join(d, "tokenizer.json")
    with open(path) as f:
      spec = json.load(f)
    edit(spec)
    with open(path, "w") as f:
      json.dump(spec, f)
  return change


def _swap_bos_eos(spec) -> None:
  """<s> and </s> trade ids in tokenizer.json (its vocab and its added tokens)."""
  vocab, added = spec["model"]["vocab"], {t["content"]: t for t in spec["added_tokens"]}
  vocab["<s>"], vocab["</s>"] = vocab["</s>"], vocab["<s>"]
  added["<s>"]["id"], added["</s>"]["id"] = added["</s>"]["id"], added["<s>"]["id"]


def _more_pieces(spec) -> None:
  """120 pieces more in a unigram tokenizer.json than the model's vocabulary has room for."""
  spec["model"]["vocab"] += [[f"extra{i}", -20.0] for i in range(120)]


def _write(name: str, text: str):
  def change(d: str) -> None:
    with open(os.path.join(d, name), "w") as f:
      f.write(text)
  return change


def _nothing_written(ctx, proc) -> bool:
  return not os.path.exists(os.path.join(ctx.dir, "converted", "checkpoints"))


def convert_inside_a_run(ctx):
  return _from_hf(_hf(ctx, "gpt2"), os.path.join(ctx.run, "checkpoints", "converted"))


def _nothing_inside_the_run(ctx, proc) -> bool:
  return not os.path.exists(os.path.join(ctx.run, "checkpoints", "converted"))


def convert_onto_a_file(ctx):
  with open(os.path.join(ctx.dir, "notes.txt"), "w") as f:
    f.write("a user's notes\n")
  return _from_hf(_hf(ctx, "bert"), os.path.join(ctx.dir, "notes.txt"))


def convert_a_run(ctx):
  """--from_hf given one of our workdirs (the trained run) instead of a Hugging Face directory."""
  return _from_hf(ctx.run, os.path.join(ctx.dir, "converted"))


def _converted(ctx, family: str) -> str:
  """`family`'s model converted (staged); the workdir."""
  run = os.path.join(ctx.dir, f"{family}_run")
  _staged(_from_hf(_hf(ctx, family), run))
  return run


def export_into_own_workdir(ctx):
  run = _converted(ctx, "qwen2")
  return _to_hf(run, run)


def export_into_another_run(ctx):
  return _to_hf(_converted(ctx, "t5"), ctx.run)


def export_over_a_file(ctx):
  with open(os.path.join(ctx.dir, "model.safetensors"), "w") as f:
    f.write("a user's file\n")
  return _to_hf(_converted(ctx, "mixtral"), os.path.join(ctx.dir, "model.safetensors"))


def export_missing_step(ctx):
  return _to_hf(_converted(ctx, "vit"), os.path.join(ctx.dir, "hf_out"), "--step=7")


def _round_trip(run: str, out: str) -> str:
  """Shell commands: export `run` to out/first, convert that back, export again to out/second."""
  return " && ".join(shlex.join(a) for a in (
      _to_hf(run, f"{out}/first"), _from_hf(f"{out}/first", f"{out}/back"),
      _to_hf(f"{out}/back", f"{out}/second")))


def vit_fine_tuned_round_trip(ctx):
  """configs/vit.py:tiny fine-tuned 2 steps with --init_from a converted ViT (digits' shape),
  resumed to 4, then exported, converted back and exported again."""
  run, tuned = _converted(ctx, "vit_digits"), os.path.join(ctx.dir, "tuned")
  train = [PY, "train.py", "--config=configs/vit.py:tiny", f"--workdir={tuned}",
           f"--init_from={run}", "--config.data.batch_size=16", "--config.train.warmup_steps=0",
           "--config.eval.every_steps=2", "--config.checkpoint.every_steps=2"]
  return ["sh", "-c", " && ".join((shlex.join(train + ["--config.train.num_steps=2"]),
                                   shlex.join(train + ["--config.train.num_steps=4"]),
                                   _round_trip(tuned, os.path.join(ctx.dir, "exports"))))]


def gpt2_fine_tuned_round_trip(ctx):
  """A converted GPT-2 fine-tuned 2 steps on its corpus with --init_from, resumed to 4, then
  exported, converted back and exported again."""
  hf, corpus = _hf(ctx, "gpt2"), os.path.join(ctx.dir, "corpus.txt")
  rnd = random.Random(0)  # sentences of the words its tokenizer was trained on
  with open(corpus, "w") as f:
    f.writelines(f"{rnd.choice(['the cat', 'a dog', 'she'])} {rnd.choice(['sees', 'likes'])} "
                 f"{rnd.choice(['the mat.', 'some fish.', 'the moon.'])}\n" for _ in range(200))
  run, tuned = os.path.join(ctx.dir, "gpt2_run"), os.path.join(ctx.dir, "tuned")
  _staged(_from_hf(hf, run))
  train = [PY, "train.py", "--config=configs/lm.py:nanogpt_cpu", f"--workdir={tuned}",
           f"--init_from={run}", "--config.data.dataset=text_files",
           f"--config.data.text_file={corpus}", f"--config.data.data_dir={ctx.dir}/tfds",
           "--config.data.max_target_len=32", "--config.data.max_source_len=32",
           "--config.data.batch_size=4",
           "--config.train.warmup_steps=0", "--config.train.schedule=constant",
           "--config.eval.every_steps=1000", "--config.eval.num_batches=1",
           "--config.checkpoint.every_steps=2"]
  return ["sh", "-c", " && ".join((shlex.join(train + ["--config.train.num_steps=2"]),
                                   shlex.join(train + ["--config.train.num_steps=4"]),
                                   _round_trip(tuned, os.path.join(ctx.dir, "exports"))))]


def _exports_equal(ctx, proc) -> bool:
  """The two exports' config.json and model.safetensors are the same bytes, at step 4."""
  out = os.path.join(ctx.dir, "exports")
  same = all(open(os.path.join(out, "first", n), "rb").read() ==
             open(os.path.join(out, "second", n), "rb").read()
             for n in ("config.json", "model.safetensors"))
  return same and "done: step=4" in proc.stdout


TENSOR = "model.layers.1.mlp.down_proj.weight"
# (name, goal, expected, setup, culprit, check, may_change) of each case.
CASES = [
    ("convert GPT-2, config.json with a layer more than the weights", "conversion checks",
     "clear error", convert_with("gpt2", config=_layers("n_layer", 1)), "h.2.", _nothing_written,
     ()),
    ("convert Llama, config.json with a layer fewer than the weights", "conversion checks",
     "clear error", convert_with("llama", config=_layers("num_hidden_layers", -1)),
     "model.layers.1.", _nothing_written, ()),
    ("convert Mistral, a tensor of another shape", "conversion checks", "clear error",
     convert_with("mistral", tensors=_narrower(TENSOR)), f"{TENSOR} has shape (64, 95)",
     _nothing_written, ()),
    ("convert Qwen2, a tensor missing", "conversion checks", "clear error",
     convert_with("qwen2", tensors=lambda s: s.pop(TENSOR)), TENSOR, _nothing_written, ()),
    ("convert Mixtral, a tensor no parameter reads", "conversion checks", "clear error",
     convert_with("mixtral", tensors=lambda s: s.update(
         {"model.extra_head.weight": s["lm_head.weight"][:2]})), "model.extra_head.weight",
     _nothing_written, ()),
    ("convert BERT, a NaN in layer 1", "conversion checks", "clear error",
     convert_with("bert", tensors=_poison("bert.encoder.layer.1.output.dense.weight", float("nan"))),
     "bert.encoder.layer.1.output.dense.weight holds 1 non-finite", _nothing_written, ()),
    ("convert T5, an infinity in the decoder", "conversion checks", "clear error",
     convert_with("t5", tensors=_poison("decoder.block.1.layer.2.DenseReluDense.wo.weight",
                                        float("inf"))),
     "decoder.block.1.layer.2.DenseReluDense.wo.weight", _nothing_written, ()),
    ("convert ViT, a NaN in the classifier", "conversion checks", "clear error",
     convert_with("vit", tensors=_poison("classifier.weight", float("nan"))),
     "classifier.weight holds 1 non-finite", _nothing_written, ()),
    ("convert a sharded checkpoint (Qwen2)", "conversion checks", "clear error",
     convert_with("qwen2", files=_sharded), "model.safetensors.index.json (a sharded",
     _nothing_written, ()),
    ("convert a GGUF file (Llama)", "conversion checks", "clear error",
     convert_with("llama", files=_rename_weights("model-Q4_K_M.gguf")), "(a GGUF file)",
     _nothing_written, ()),
    ("convert flax_model.msgpack (BERT)", "conversion checks", "clear error",
     convert_with("bert", files=_rename_weights("flax_model.msgpack")),
     "flax_model.msgpack (a Flax checkpoint)", _nothing_written, ()),
    ("convert tf_model.h5 (ViT)", "conversion checks", "clear error",
     convert_with("vit", files=_rename_weights("tf_model.h5")),
     "tf_model.h5 (a TensorFlow checkpoint)", _nothing_written, ()),
    ("convert GPT-2, eos_token_id on an ordinary token", "conversion checks", "clear error",
     convert_with("gpt2", config=lambda hf: hf.update(eos_token_id=9)),
     "eos_token_id=9, but tokenizer.json's id 9", _nothing_written, ()),
    ("convert Mistral, tokenizer.json with <s> and </s> swapped", "conversion checks",
     "clear error", convert_with("mistral", files=_tokenizer(_swap_bos_eos)),
     "bos_token_id=1, but tokenizer.json's id 1 is '</s>'", _nothing_written, ()),
    ("convert Llama, tokenizer_config.json naming another EOS", "conversion checks",
     "clear error", convert_with("llama", files=_write(
         "tokenizer_config.json", json.dumps({"bos_token": "<s>", "eos_token": "<unk>"}))),
     "tokenizer_config.json's eos_token '<unk>'", _nothing_written, ()),
    ("convert T5, tokenizer.json larger than the vocabulary", "conversion checks",
     "clear error", convert_with("t5", files=_tokenizer(_more_pieces)),
     "more than config.json's vocab_size=96", _nothing_written, ()),
    ("convert BERT, tokenizer.json that is no tokenizer", "conversion checks", "clear error",
     convert_with("bert", files=_write("tokenizer.json", "{}")),
     "tokenizer.json: not a Hugging Face tokenizers tokenizer.json", _nothing_written, ()),
    ("convert Mixtral, config.json that is not JSON", "conversion checks", "clear error",
     convert_with("mixtral", files=_write("config.json", '{"model_type": "mixtral",\n')),
     "config.json:2: not valid JSON", _nothing_written, ()),
    ("convert Qwen2, config.json holding a list", "conversion checks", "clear error",
     convert_with("qwen2", files=_write("config.json", "[1, 2]")),
     "config.json: holds a JSON list", _nothing_written, ()),
    ("convert into a folder inside a run's workdir", "nothing lost", "clear error",
     convert_inside_a_run, "is inside the run", _nothing_inside_the_run, ()),
    ("convert --workdir that is a user's file", "nothing lost", "clear error",
     convert_onto_a_file, "is a file", None, ()),
    ("convert --from_hf one of our runs", "clear messages", "clear error", convert_a_run,
     "is a run's workdir, not a Hugging Face directory", None, ()),
    ("export Qwen2 into the run's own workdir", "nothing lost", "clear error",
     export_into_own_workdir, "the run's own workdir", None, ()),
    ("export T5 into another run's workdir", "nothing lost", "clear error",
     export_into_another_run, "is the workdir of a run", None, ()),
    ("export Mixtral over a user's file", "nothing lost", "clear error", export_over_a_file,
     "is a file, not a directory", None, ()),
    ("export ViT, a step the run lacks", "clear messages", "clear error", export_missing_step,
     "step 7", None, ()),
    ("ViT fine-tuned from a conversion, resumed, exported: round trip", "exports", "ok",
     vit_fine_tuned_round_trip, "", _exports_equal, ()),
    ("GPT-2 fine-tuned from a conversion, resumed, exported: round trip", "exports", "ok",
     gpt2_fine_tuned_round_trip, "", _exports_equal, ()),
]
