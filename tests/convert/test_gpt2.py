"""Hugging Face GPT-2 <-> workdir (transformer/convert/gpt2.py), checked against Hugging Face itself.

Everything is offline: a tiny GPT2LMHeadModel (2 layers, d_model 32, a ~100-id vocabulary) is
built from a GPT2Config with every weight randomised (LayerNorm scales and all biases too, so a
swapped or transposed tensor cannot hide), saved with save_pretrained next to a BPE tokenizer
trained here from a few sentences with the `tokenizers` library, then converted. The reference is
always Hugging Face's own forward pass or generate, never our code.
"""

import dataclasses
import functools
import json
import os
import random
import subprocess
import sys

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers_lib = pytest.importorskip("tokenizers")

import transformer  # noqa: E402
from transformer import convert  # noqa: E402
from transformer.config import model_config  # noqa: E402
from transformer.convert import gpt2  # noqa: E402
from transformer.data import tokenizers  # noqa: E402
from transformer.infer import evaluation, predict

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_POSITIONS = 64
EOT = "<|endoftext|>"


def corpus(num_sentences: int = 300) -> str:
  """Deterministic sentence-like text (seeded choices from a few words)."""
  rnd = random.Random(0)
  subjects, verbs, objects = (["the cat", "a dog", "my friend", "the old man", "she"],
                              ["sees", "likes", "finds", "eats", "wants"],
                              ["the mat.", "a red ball.", "some fish.", "the moon.", "it."])
  return "\n".join(f"{rnd.choice(subjects)} {rnd.choice(verbs)} {rnd.choice(objects)}"
                   for _ in range(num_sentences)) + "\n"


def tiny_tokenizer(text: str):
  """A byte-pair tokenizer with GPT-2's <|endoftext|> (id 0 here, like GPT-2's "!": shifted too)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Metaspace()
  tok.decoder = decoders.Metaspace()
  tok.train_from_iterator(text.splitlines(), trainers.BpeTrainer(
      vocab_size=100, special_tokens=[EOT], show_progress=False))
  return tok


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  """(directory, model) of a saved random GPT-2 with its tokenizer.json."""
  tmp = tmp_path_factory.mktemp("hf")
  text = corpus()
  (tmp / "corpus.txt").write_text(text, encoding="utf-8")
  tok = tiny_tokenizer(text)
  eot = tok.token_to_id(EOT)
  config = transformers.GPT2Config(
      vocab_size=tok.get_vocab_size(), n_positions=N_POSITIONS, n_embd=32, n_layer=2, n_head=4,
      bos_token_id=eot, eos_token_id=eot, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
  torch.manual_seed(0)
  model = transformers.GPT2LMHeadModel(config).eval()
  with torch.no_grad():
    for p in model.parameters():  # LayerNorm scales around 1, every bias non-zero
      p.add_(0.3 * torch.randn_like(p))
  directory = tmp / "gpt2"
  model.save_pretrained(directory)
  tok.save(str(directory / "tokenizer.json"))
  return str(directory), model


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """One TFDS directory for the module: the corpus is prepared once."""
  return str(tmp_path_factory.mktemp("tfds"))


def run_command(command: str) -> subprocess.CompletedProcess:
  """`command` run by bash from the repository root (CPU only); fails the test if it fails."""
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  done = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  return done


@pytest.fixture(scope="module")
def converted_cli(hf_dir, data_dir, tmp_path_factory):
  """(workdir, stdout) of `python -m transformer.convert --from_hf=DIR --workdir=OUT
  --text_file=CORPUS` (data: the corpus next to the model)."""
  directory, _ = hf_dir
  workdir = str(tmp_path_factory.mktemp("converted") / "run")
  corpus_file = os.path.join(os.path.dirname(directory), "corpus.txt")
  done = run_command(f"{sys.executable} -m transformer.convert --from_hf={directory} "
                     f"--workdir={workdir} --text_file={corpus_file} --data_dir={data_dir}")
  return workdir, done.stdout


@pytest.fixture(scope="module")
def converted(converted_cli):
  return converted_cli[0]


@pytest.fixture(scope="module")
def run(converted):
  return transformer.restore(converted)


def hf_logits(model, ids, mask, positions=None):
  with torch.no_grad():
    kwargs = {} if positions is None else {"position_ids": torch.tensor(positions)}
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), **kwargs)
  return out.logits.numpy()


def our_logits(run, ids, mask, positions, hf_config):
  """Our teacher-forced logits on HF ids, each at its place in ours (gpt2.our_ids of the HF
  model's config: id + NUM_SPECIAL, <|endoftext|> our EOS), columns back on HF ids.

  The ids go in as decoder inputs (no shift right: GPT-2 is given the same tokens); padding is
  id 0 with segment id 0: it attends to nothing and nothing attends to it, and its rows (zero
  attention output, logits of no meaning) are never compared, as Hugging Face's are not.
  """
  places = gpt2.our_ids(hf_config.to_dict())
  ours = np.where(mask, places[np.asarray(ids)], 0)
  # jitted: op by op, the forward pass would compile each of its operations on its own
  decode = jax.jit(functools.partial(run.model.apply, method="decode"))
  logits = decode({"params": run.params}, ours, np.asarray(positions), np.asarray(mask, np.int32))
  return np.asarray(logits)[..., places]


def padded_batch(side: str, vocab: int):
  """ids [3, 12] below `vocab` with rows of 12, 7 and 3 real tokens padded on `side`; mask;
  positions."""
  rng = np.random.default_rng(0)
  lengths, width = (12, 7, 3), 12
  ids, mask = np.zeros((3, width), np.int64), np.zeros((3, width), np.int64)
  for r, n in enumerate(lengths):
    cols = slice(0, n) if side == "right" else slice(width - n, width)
    ids[r, cols], mask[r, cols] = rng.integers(0, vocab, n), 1
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  return ids, mask, positions


@pytest.mark.parametrize("side", ["right", "left"])
def test_logits_equal_hugging_face_with_padding(hf_dir, run, side):
  """HF -> ours: the converted model's logits equal GPT-2's own forward to 1e-4 (float32) at every
  real token, with right padding (positions 0.. from the left) and with left padding (positions
  counted from each row's first real token, given to both models): the weight mapping, the
  tanh GELU, pre-LN with the final LayerNorm, learned positions, tied head, attention scale and
  the id shift are all right, and padding changes nothing."""
  _, model = hf_dir
  ids, mask, positions = padded_batch(side, model.config.vocab_size)
  want = hf_logits(model, ids, mask, positions if side == "left" else None)
  got = our_logits(run, ids, mask, positions, model.config)
  real = mask.astype(bool)
  assert np.abs(got[real] - want[real]).max() <= 1e-4


def test_start_token_reads_the_tied_bos_row(hf_dir, run):
  """A tied GPT-2's start token (our 0) reads <|endoftext|>'s row (model.start_embedding_id, our
  EOS): the row Hugging Face starts with and scores <|endoftext|> with, so fine-tuning trains one
  row for both, as the export has it. Our own row 0 is read by nothing."""
  _, model = hf_dir
  assert run.config.model.tie_embeddings
  assert run.config.model.start_embedding_id == gpt2.our_ids(model.config.to_dict())[
      model.config.bos_token_id]
  ids = np.array([[0, 7, 9, 11]])
  positions, mask = np.arange(4)[None], np.ones((1, 4), np.int32)
  decode = jax.jit(functools.partial(run.model.apply, method="decode"))
  params = jax.tree_util.tree_map(np.array, run.params)
  before = np.asarray(decode({"params": params}, ids, positions, mask))
  table = params["token_embed"]["embedding"]
  table[0] *= -1.0  # row 0 spoiled: nothing changes
  assert np.array_equal(np.asarray(decode({"params": params}, ids, positions, mask)), before)
  start = run.config.model.start_embedding_id
  table[start] *= -1.0  # the BOS row: the start's scores of every other token move
  after = np.asarray(decode({"params": params}, ids, positions, mask))
  assert np.abs(np.delete(after[0, 0] - before[0, 0], start)).max() > 1e-3


def test_greedy_generation_equals_hugging_face_generate(hf_dir, run):
  """Our cached greedy decoding (batched prompts of different lengths, start token + left-padded
  prefill) emits GPT-2's generate(do_sample=False) tokens: our start token 0 is GPT-2's
  <|endoftext|> (its bos) and Hugging Face gets it in front of each prompt."""
  _, model = hf_dir
  eot, steps = model.config.eos_token_id, 12
  prompts = [[5, 17, 30, 8, 41], [22, 3], [60, 0, 62]]
  ours, _ = evaluation.decode_batches(
      run.config, run.model, run.params, [[i + tokenizers.NUM_SPECIAL for i in p] for p in prompts],
      dataclasses.replace(run.config.eval.decode, method="greedy", max_decode_len=steps),
      eos_id=tokenizers.EOS_ID, batch_size=4)
  width = max(map(len, prompts)) + 1
  ids = np.full((3, width), eot)
  mask = np.zeros((3, width), np.int64)
  for r, p in enumerate(prompts):
    ids[r, width - len(p) - 1:] = [eot, *p]
    mask[r, width - len(p) - 1:] = 1
  with torch.no_grad():
    out = model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                         do_sample=False, max_new_tokens=steps, eos_token_id=eot,
                         pad_token_id=eot).numpy()[:, width:]
  for r in range(3):
    hf = list(out[r])
    hf = hf[:hf.index(eot)] if eot in hf else hf
    assert [t - tokenizers.NUM_SPECIAL for t in ours[r]] == hf


def test_round_trip_is_bitwise_equal(hf_dir, converted, tmp_path):
  """HF -> ours -> HF: every tensor of the state dict Hugging Face loads back is bitwise equal to
  the original's, and the architecture keys of config.json are unchanged (the inserted special
  rows are dropped again; reshapes never round)."""
  directory, model = hf_dir
  convert.to_hf(converted, str(tmp_path / "back"))
  back = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "back"))
  original, restored = model.state_dict(), back.state_dict()
  assert sorted(original) == sorted(restored)
  for key, value in original.items():
    assert torch.equal(value, restored[key]), key
  with open(os.path.join(directory, "config.json")) as f:
    source = json.load(f)
  with open(tmp_path / "back" / "config.json") as f:
    written = json.load(f)
  for key in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner",
              "activation_function",
              "layer_norm_epsilon", "eos_token_id", "bos_token_id", "tie_word_embeddings"):
    assert written.get(key) == source.get(key), key
  assert (tmp_path / "back" / "tokenizer.json").read_text() == open(
      os.path.join(directory, "tokenizer.json")).read()


def test_converted_workdir_restores_predicts_and_evaluates(converted, run, capsys):
  """The workdir is one the rest of the library reads: restore() gives a decoder-only run with the
  'hf' tokenizer (GPT-2 ids + 4), `python -m transformer.infer.predict` continues a prompt, and eval.py's
  evaluate() scores the --text_file's validation split."""
  assert run.config.model.ffn == "gelu_tanh" and run.config.model.positional == "learned"
  assert run.target_tokenizer.kind == "hf" and run.step == 0
  tok = run.target_tokenizer
  assert tok.decode(tok.encode("the cat sees the moon.")) == "the cat sees the moon."
  assert predict.main(["--workdir", converted, "the cat"]) == 0
  line = capsys.readouterr().out.strip()
  assert line.startswith("the cat\t")
  results = evaluation.evaluate_split(converted, split="validation", verbose=False)
  assert results["step"] == 0 and np.isfinite(results["loss"]) and "bits_per_token" in results


@pytest.fixture(scope="module")
def finetuned(converted, hf_dir, data_dir, tmp_path_factory):
  """(workdir, metrics lines) of `train.py --init_from=<converted>` for 8 steps on the corpus."""
  tmp = tmp_path_factory.mktemp("finetune")
  text_file = os.path.join(os.path.dirname(hf_dir[0]), "corpus.txt")
  workdir = str(tmp / "run")
  cmd = [sys.executable, "train.py", "--config=configs/lm.py:nanogpt_cpu", f"--workdir={workdir}",
         f"--init_from={converted}", "--config.data.dataset=text_files",
         f"--config.data.text_file={text_file}", f"--config.data.data_dir={data_dir}",
         "--config.data.max_target_len=32", "--config.data.max_source_len=32",
         "--config.data.batch_size=8", "--config.train.num_steps=8",
         "--config.train.warmup_steps=0", "--config.train.learning_rate=3e-3",
         "--config.train.log_every_steps=1", "--config.eval.every_steps=8",
         "--config.eval.num_batches=1", "--config.checkpoint.every_steps=8"]
  run_command(" ".join(cmd))
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return workdir, [json.loads(line) for line in f]


def test_fine_tuning_from_a_converted_workdir_lowers_the_loss(converted, run, finetuned):
  """`train.py --init_from=OUT` trains the converted GPT-2 itself: its model config and 'hf'
  tokenizer carry over (lm.py's char model and tokenizer do not), every parameter moved at most a
  few learning rates from the converted one (so it started there, not from a random init), and
  the training loss fell from the converted model's (step 1's loss is computed before any
  update)."""
  workdir, lines = finetuned
  tuned = transformer.restore(workdir)
  assert tuned.config.model == dataclasses.replace(run.config.model, dropout_rate=0.0,
                                                   attention_dropout_rate=0.0)
  assert tuned.target_tokenizer == run.target_tokenizer
  moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
              for a, b in zip(jax.tree.leaves(tuned.params), jax.tree.leaves(run.params)))
  assert 0 < moved < 8 * 3e-3 * 1.5
  losses = [m["train/loss"] for m in lines if "train/loss" in m]
  assert len(losses) == 8 and losses[-1] < losses[0] - 0.1


def test_ours_to_hf_logits_equal_after_fine_tuning(finetuned, tmp_path):
  """ours -> HF: a model trained here (fine-tuned: its special rows and every weight are now ours)
  exported with --to_hf gives Hugging Face logits equal to ours to 1e-4, with right padding."""
  workdir, _ = finetuned
  tuned = transformer.restore(workdir)
  convert.to_hf(workdir, str(tmp_path / "hf"))
  model = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
  ids, mask, positions = padded_batch("right", model.config.vocab_size)
  want = hf_logits(model, ids, mask)
  got = our_logits(tuned, ids, mask, positions, model.config)
  real = mask.astype(bool)
  assert np.abs(got[real] - want[real]).max() <= 1e-4


def test_cli_from_hf_and_to_hf(hf_dir, converted_cli, tmp_path):
  """`python -m transformer.convert --from_hf=DIR --workdir=OUT` (the fixture every other test
  reads), then `--workdir=OUT --to_hf=DIR2`, as subprocesses: both exit 0 with one summary line,
  and DIR2 holds GPT-2's weights bitwise."""
  _, model = hf_dir
  out, stdout = converted_cli
  back = str(tmp_path / "back")
  done = run_command(f"{sys.executable} -m transformer.convert --workdir={out} --to_hf={back}")
  assert stdout.strip().splitlines() == [stdout.strip()] and stdout.startswith(f"wrote {out}")
  assert done.stdout.strip() == done.stdout.strip().splitlines()[0]
  assert done.stdout.startswith(f"wrote {back}")
  from safetensors.numpy import load_file
  weights = load_file(os.path.join(back, "model.safetensors"))
  assert np.array_equal(weights["transformer.h.1.attn.c_attn.weight"],
                        model.state_dict()["transformer.h.1.attn.c_attn.weight"].numpy())


def test_unmappable_configs_are_one_line_errors_naming_the_key(converted, hf_dir, tmp_path, capsys):
  """--to_hf of a run with RoPE names model.positional; --from_hf of an unsupported family (BART)
  names model_type; each is exit status 1 and one line on stderr."""
  bad = tmp_path / "rope"
  bad.mkdir()
  with open(os.path.join(converted, "config.json")) as f:
    cfg = json.load(f)
  cfg["model"]["positional"] = "rope"
  (bad / "config.json").write_text(json.dumps(cfg))
  assert convert.main(["--workdir", str(bad), "--to_hf", str(tmp_path / "x")]) == 1
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "model.positional='rope'" in err
  bart = tmp_path / "bart"
  bart.mkdir()
  (bart / "config.json").write_text(json.dumps({"model_type": "bart"}))
  (bart / "model.safetensors").write_bytes(b"")
  assert convert.main(["--from_hf", str(bart), "--workdir", str(tmp_path / "y")]) == 1
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "model_type='bart'" in err
  with pytest.raises(convert.ConvertError, match="model.ffn='swiglu'"):
    gpt2.hf_config(model_config(arch="decoder_only", positional="learned", norm_position="pre",
                                scale_embeddings=False, ffn="swiglu"))


def test_hf_tokenizer_kind_is_a_config_value(hf_dir, data_dir, tmp_path):
  """data.tokenizer='hf' with data.hf_tokenizer=<tokenizer.json or its directory> builds the
  tokenizer Hugging Face's own gives, every id + 4, also through load_task for any LM config;
  it saves (as hf_tokenizer.json next to our tokenizer.json) and loads back equal; decoding
  stops at our EOS like every other kind."""
  from configs import lm
  from transformer.data import load_task
  directory, _ = hf_dir
  cd = lm.get_config("nanogpt_cpu")
  cd.data.update(dataset="text_files", data_dir=data_dir, tokenizer="hf", hf_tokenizer=directory,
                 text_file=os.path.join(os.path.dirname(directory), "corpus.txt"))
  task = load_task(cd, str(tmp_path / "run"), process_index=0, process_count=1)
  assert task.target_tokenizer == tokenizers.build("hf", [], hf_tokenizer=directory)
  assert tokenizers.load(str(tmp_path / "run" / "tokenizers" / "target")) == task.target_tokenizer
  tok = tokenizers.build("hf", [], hf_tokenizer=directory)
  assert tok == tokenizers.build("hf", [], hf_tokenizer=os.path.join(directory, "tokenizer.json"))
  reference = tokenizers_lib.Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
  text = "my friend likes some fish."
  assert tok.encode(text) == [i + tokenizers.NUM_SPECIAL for i in reference.encode(text).ids]
  assert tok.vocab_size == reference.get_vocab_size() + tokenizers.NUM_SPECIAL
  tok.save(str(tmp_path / "tok"))
  assert sorted(os.listdir(tmp_path / "tok")) == ["hf_tokenizer.json", "tokenizer.json"]
  assert tokenizers.load(str(tmp_path / "tok")) == tok
  assert tok.decode(tok.encode(text) + [tokenizers.EOS_ID] + tok.encode("she")) == text


def test_notebook_plots_a_converted_gpt2(converted, tmp_path):
  """The notebook's last section (notebooks/explore.py), run on the converted workdir, draws the
  learned positional embeddings and the last layer's attention maps."""
  import jupytext
  from transformer.infer import viz
  notebook = jupytext.read(os.path.join(REPO, "notebooks", "explore.py"))
  cells = [c.source for c in notebook.cells]
  code = cells[next(i for i, c in enumerate(cells) if c.startswith("## A converted GPT-2")) + 1]
  env = dict(os=os, transformer=transformer, viz=viz, HF_WORKDIR=converted, HF_TEXT="the cat sees the moon.",
             FIG_DIR=str(tmp_path))
  exec(code, env)  # pylint: disable=exec-used
  assert sorted(os.listdir(tmp_path)) == ["gpt2_attention.png", "gpt2_positional.png"]


def test_pytorch_bin_reads_as_safetensors(hf_dir, tmp_path):
  """A directory with pytorch_model.bin (older checkpoints; torch.save of the state dict, tied
  head included) reads as the same tensors as model.safetensors."""
  directory, model = hf_dir
  (tmp_path / "config.json").write_text(open(os.path.join(directory, "config.json")).read())
  torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
  _, from_bin = convert.read_hf(str(tmp_path))
  _, from_safetensors = convert.read_hf(directory)
  assert set(from_bin) == set(from_safetensors) | {"lm_head.weight"}
  for key, value in from_safetensors.items():
    assert np.array_equal(from_bin[key], value), key


def test_scanned_layers_export_like_unrolled_ones(run):
  """A run trained with model.scan_layers (its layers stacked on axis 0 under 'layers') exports
  the same GPT-2 state dict as the unrolled layers_i it stacks."""
  params = jax.tree.map(np.asarray, run.params)
  decoder = dict(params["decoder"])
  layers = [decoder.pop(f"layers_{i}") for i in range(run.config.model.num_decoder_layers)]
  scanned = {**params, "decoder": {**decoder, "layers": jax.tree.map(
      lambda *xs: np.stack(xs), *layers)}}
  want = gpt2.hf_from_params(params, run.config.model)
  got = gpt2.hf_from_params(scanned, run.config.model)
  assert sorted(got) == sorted(want)
  assert all(np.array_equal(got[k], want[k]) for k in want)


def test_main_restores_the_callers_logging_verbosity(tmp_path):
  """convert.main quiets absl logging while it runs and gives the caller back its verbosity (an
  in-process caller, e.g. a test after it in the same worker, still sees its warnings)."""
  from absl import logging  # pylint: disable=g-import-not-at-top  (a test of absl's state)
  logging.set_verbosity(logging.INFO)
  assert convert.main(["--workdir", str(tmp_path / "none"), "--to_hf", str(tmp_path / "x")]) == 1
  assert logging.get_verbosity() == logging.INFO


def test_tied_mup_run_off_its_base_is_refused_in_one_line(converted, tmp_path, capsys):
  """--to_hf of a µP run (tied embeddings, d_model 32 on base width 8) cannot fold its logits'
  1/4 into the shared table: exit status 1 and one line naming model.tie_embeddings."""
  bad = tmp_path / "mup"
  bad.mkdir()
  with open(os.path.join(converted, "config.json")) as f:
    cfg = json.load(f)
  cfg["model"].update(parametrization="mup", mup_base_width=8)
  (bad / "config.json").write_text(json.dumps(cfg))
  assert convert.main(["--workdir", str(bad), "--to_hf", str(tmp_path / "x")]) == 1
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "model.tie_embeddings=True at d_model=32" in err
  assert not os.path.exists(tmp_path / "x" / "model.safetensors")
