"""Hugging Face T5 <-> workdir (transformer/convert/t5.py), checked against Hugging Face itself.

Everything is offline. Two tiny T5ForConditionalGeneration models are built from a T5Config:
"flan", T5 v1.1 / Flan-T5's layout (gated-gelu, untied lm_head, no output rescaling), and "t5",
the original T5's (relu, tied head, decoder output times d_model**-0.5). Both have 2 encoder and 3
decoder layers, d_model 32, 4 heads of d_kv 16 (not d_model / num_heads = 8), 8 relative buckets
up to distance 20 (so rows of 14 tokens reach the log-spaced buckets), a 96-id vocabulary over a
~80-id tokenizer (as T5's 32128 over 32100). Every RMSNorm scale and the relative-bias tables are
randomised too, so a swapped or transposed tensor cannot hide. A unigram tokenizer (T5's kind)
with T5's <pad> 0, </s> 1, <unk> 2 is trained here with the `tokenizers` library. The reference
is always Hugging Face's own forward pass or generate, never our code.
"""

import contextlib
import dataclasses
import functools
import io
import json
import os
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
from transformer.convert import t5  # noqa: E402
from transformer.data import tokenizers  # noqa: E402
from transformer.infer import evaluation, predict

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB = 96
FAMILIES = {  # name -> T5Config keys beyond the shared ones
    "flan": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
    "t5": dict(feed_forward_proj="relu", tie_word_embeddings=True),
}
TEXT = ["the cat sees the moon.", "a dog likes some fish.", "my friend finds a red ball.",
        "she wants the mat.", "the old man eats it."] * 20


def tiny_tokenizer():
  """A SentencePiece-style unigram tokenizer (T5's kind) with T5's special ids: <pad> 0, </s> 1,
  <unk> 2 (a unigram model names its unknown token by id)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  tok = Tokenizer(models.Unigram())
  tok.pre_tokenizer = pre_tokenizers.Metaspace()
  tok.decoder = decoders.Metaspace()
  tok.train_from_iterator(TEXT, trainers.UnigramTrainer(
      vocab_size=80, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
      show_progress=False))
  return tok


def hf_model(family: str, seed: int = 0):
  """A random T5ForConditionalGeneration of `family` in eval mode (dropout off)."""
  config = transformers.T5Config(
      vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=48, num_layers=2, num_decoder_layers=3,
      num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20,
      dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
      **FAMILIES[family])
  torch.manual_seed(seed)
  model = transformers.T5ForConditionalGeneration(config)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "layer_norm" in name:
        p.mul_(1 + 0.3 * torch.randn_like(p))
      elif "relative_attention_bias" in name:
        p.normal_(0.0, 1.0)
    if not config.scale_decoder_outputs:  # transformers 5 ties every T5's head at init: untie it
      model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, 32) * 32**-0.5)
  return model.eval()


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
  """family -> (directory, model) of a saved random T5 with its tokenizer.json."""
  tok = tiny_tokenizer()
  out = {}
  for family in FAMILIES:
    directory = tmp_path_factory.mktemp("hf") / family
    model = hf_model(family)
    model.save_pretrained(directory)
    tok.save(str(directory / "tokenizer.json"))
    out[family] = (str(directory), model)
  return out


@pytest.fixture(scope="module")
def converted_cli(hf_dirs, tmp_path_factory):
  """family -> (workdir, stdout) of the command line's main(["--from_hf=DIR", "--workdir=OUT"]),
  run in-process (tests/convert/test_gpt2.py runs `python -m transformer.convert` as a
  subprocess)."""
  out = {}
  for family, (directory, _) in hf_dirs.items():
    workdir = str(tmp_path_factory.mktemp("converted") / family)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
      assert convert.main([f"--from_hf={directory}", f"--workdir={workdir}"]) == 0
    out[family] = (workdir, stdout.getvalue())
  return out


@pytest.fixture(scope="module")
def converted(converted_cli):
  return {family: workdir for family, (workdir, _) in converted_cli.items()}


@pytest.fixture(scope="module")
def runs(converted):
  return {family: transformer.restore(workdir) for family, workdir in converted.items()}


def padded(lengths, width, rng, eos=True):
  """ids [b, width] right-padded with 0 (T5's pad), ordinary ids in [3, VOCAB), each row ending
  with </s> (1) when `eos`; mask."""
  ids, mask = np.zeros((len(lengths), width), np.int64), np.zeros((len(lengths), width), np.int64)
  for r, n in enumerate(lengths):
    ids[r, :n] = rng.integers(3, VOCAB, n)
    if eos:
      ids[r, n - 1] = 1
    mask[r, :n] = 1
  return ids, mask


def batch(seed=0):
  """Sources of 14, 9 and 4 tokens and targets of 11, 6 and 2, right-padded (both sides)."""
  rng = np.random.default_rng(seed)
  return padded((14, 9, 4), 14, rng), padded((11, 6, 2), 11, rng)


def hf_logits(model, inputs, inputs_mask, targets):
  """Hugging Face's teacher-forced logits: labels with -100 on padding, so decoder_input_ids are
  the labels shifted right behind decoder_start_token_id (0), padding read as pad (0)."""
  labels = np.where(targets == 0, -100, targets)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(inputs), attention_mask=torch.tensor(inputs_mask),
                labels=torch.tensor(labels))
  return out.logits.numpy()


@functools.cache
def _jit_apply(model):
  """model.apply compiled once per model (op-by-op dispatch compiles every op of the forward)."""
  return jax.jit(model.apply)


def our_logits(run, inputs, targets, params=None):
  """Our teacher-forced logits (EncoderDecoder.__call__: padding is id 0 on both sides)."""
  params = run.params if params is None else params
  return np.asarray(_jit_apply(run.model)({"params": params}, np.asarray(inputs, np.int32),
                                          np.asarray(targets, np.int32)))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_equal_hugging_face_with_padding(hf_dirs, runs, family):
  """HF -> ours: the converted model's logits equal T5's own forward to 1e-4 (float32) at every
  real target token, over the whole vocabulary (ids are T5's), with right padding in the sources
  (attention_mask) and in the targets: the weight mapping (q/k/v/o transposes, gated or plain
  FFN, first-layer relative bias shared by the stack, bidirectional encoder and causal decoder
  buckets), RMSNorm, unscaled attention logits, d_kv != d_model / num_heads, the tied head with
  d_model**-0.5 ("t5") and the untied one ("flan"), and the start token are all right."""
  _, model = hf_dirs[family]
  (inputs, inputs_mask), (targets, targets_mask) = batch()
  want = hf_logits(model, inputs, inputs_mask, targets)
  got = our_logits(runs[family], inputs, targets)
  real = targets_mask.astype(bool)
  assert got.shape == want.shape
  assert np.abs(got[real] - want[real]).max() <= 1e-4


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_generation_equals_hugging_face_generate(hf_dirs, runs, family):
  """Our cached greedy decoding (sources of different lengths, right-padded, one batch) emits
  T5's generate(do_sample=False, num_beams=1) tokens, which start from decoder_start_token_id
  (pad 0, our start token) and stop at </s> (1, our EOS). A random model rarely emits </s>, so
  the "flan" model's </s> row of lm_head becomes 1.05 times that of the token it emits third,
  on both sides alike, so that some rows stop mid-way.
  Our decoding never emits the pad (0), which a trained T5 never predicts but a random one
  may: Hugging Face is given the same rule (suppress_tokens=[0]). (It runs uncached:
  transformers 5.23's cache sizes itself by the encoder's layer count, and these decoders have
  one more layer.)"""
  directory, model = hf_dirs[family]
  run, steps = runs[family], 12
  (inputs, mask), _ = batch(seed=1)

  def generate(model):
    with torch.no_grad():
      return model.generate(input_ids=torch.tensor(inputs), attention_mask=torch.tensor(mask),
                            do_sample=False, num_beams=1, max_new_tokens=steps, use_cache=False,
                            suppress_tokens=[0], decoder_start_token_id=0, eos_token_id=1,
                            pad_token_id=0).numpy()

  params = run.params
  if family == "flan":  # the same change on both sides: </s> where a common token was
    third = int(generate(model)[0, 3])
    model = transformers.T5ForConditionalGeneration.from_pretrained(directory).eval()
    with torch.no_grad():
      model.lm_head.weight[1] = 1.05 * model.lm_head.weight[third]
    params = jax.tree.map(np.asarray, run.params)
    params["decoder"]["logits_dense"]["kernel"] = model.lm_head.weight.detach().numpy().T.copy()
  sources = [list(row[m.astype(bool)]) for row, m in zip(inputs, mask)]
  ours, _ = evaluation.decode_batches(
      run.config, run.model, params, sources,
      dataclasses.replace(run.config.eval.decode, method="greedy", max_decode_len=steps),
      eos_id=tokenizers.EOS_ID, batch_size=4)
  out = generate(model)
  assert (out[:, 0] == 0).all()
  stopped = 0
  for r in range(len(sources)):
    hf = list(out[r, 1:])
    stopped += 1 in hf
    hf = hf[:hf.index(1)] if 1 in hf else hf
    assert ours[r] == hf, r
  assert family != "flan" or stopped  # the EOS path was exercised


@pytest.mark.parametrize("family", list(FAMILIES))
def test_round_trip_is_bitwise_equal(hf_dirs, converted, family, tmp_path):
  """HF -> ours -> HF: every tensor of the state dict Hugging Face loads back is bitwise equal to
  the original's (transposes and reshapes never round), the head stays tied or untied, and the
  architecture keys of config.json and the tokenizer.json are unchanged."""
  directory, model = hf_dirs[family]
  convert.to_hf(converted[family], str(tmp_path / "back"))
  back = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "back"))
  original, restored = model.state_dict(), back.state_dict()
  assert sorted(original) == sorted(restored)
  for key, value in original.items():
    assert torch.equal(value, restored[key]), key
  assert back.config.scale_decoder_outputs == model.config.scale_decoder_outputs
  assert (back.lm_head.weight.data_ptr() == back.shared.weight.data_ptr()) == (family == "t5")
  with open(os.path.join(directory, "config.json")) as f:
    source = json.load(f)
  with open(tmp_path / "back" / "config.json") as f:
    written = json.load(f)
  for key in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers",
              "num_heads", "relative_attention_num_buckets", "relative_attention_max_distance",
              "layer_norm_epsilon", "feed_forward_proj", "decoder_start_token_id",
              "pad_token_id", "eos_token_id", "scale_decoder_outputs"):
    assert written.get(key) == source.get(key), key
  assert (tmp_path / "back" / "tokenizer.json").read_text() == open(
      os.path.join(directory, "tokenizer.json")).read()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_ours_to_hf_logits_equal(runs, family, tmp_path):
  """ours -> HF: a workdir (written as a conversion writes one, with no converted_from.json) whose
  parameters are new random arrays of our layout, none of them T5's, exported with to_hf gives
  Hugging Face logits equal to ours to 1e-4, with padding in sources and targets."""
  run = runs[family]
  rng = np.random.default_rng(7)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: np.float32(1 + 0.3 * rng.normal(size=np.shape(x)))
      if "norm" in jax.tree_util.keystr(path)
      else np.float32(rng.normal(size=np.shape(x)) * np.std(x)), run.params)
  workdir = str(tmp_path / "ours")
  convert.write_workdir(run.config, params, run.target_tokenizer, workdir)
  convert.to_hf(workdir, str(tmp_path / "hf"))
  model = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "hf")).eval()
  (inputs, inputs_mask), (targets, targets_mask) = batch(seed=2)
  want = hf_logits(model, inputs, inputs_mask, targets)
  got = our_logits(run, inputs, targets, params)
  real = targets_mask.astype(bool)
  assert np.abs(got[real] - want[real]).max() <= 1e-4


def test_relative_buckets_equal_hugging_face(runs):
  """positional.relative_position_bucket equals T5Attention._relative_position_bucket for every
  offset in [-300, 300], bidirectional (encoder) and causal (decoder), at T5's 32/128 and the test
  models' 8/20."""
  from transformer.model import positional
  rel = np.arange(-300, 301)
  for buckets, distance in ((32, 128), (8, 20)):
    for bidirectional in (True, False):
      want = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
          torch.tensor(rel), bidirectional, buckets, distance).numpy()
      got = np.asarray(positional.relative_position_bucket(rel, bidirectional, buckets, distance))
      np.testing.assert_array_equal(got, want)


def test_converted_workdir_restores_and_tokenizes_like_t5(hf_dirs, converted, runs, capsys):
  """The workdir is one the library reads: restore() gives an encoder-decoder run whose 'hf'
  tokenizer (both sides, data.hf_id_offset=0) encodes exactly as the tokenizers library does
  (T5's ids, no shift; its unknown token is T5's <unk> 2), decodes back and stops at </s>, and
  generate_text and `python -m transformer.infer.predict` run end to end."""
  run = runs["flan"]
  assert run.config.model.ffn == "geglu_tanh" and not run.config.model.tie_embeddings
  assert runs["t5"].config.model.ffn == "relu" and runs["t5"].config.model.scale_decoder_output
  assert run.config.data.hf_id_offset == 0 and run.step == 0
  tok = run.target_tokenizer
  assert run.source_tokenizer == tok and tok.kind == "hf" and tok.unk_id == 2
  reference = tokenizers_lib.Tokenizer.from_file(
      os.path.join(hf_dirs["flan"][0], "tokenizer.json"))
  text = "the cat likes a red ball."
  assert tok.encode(text) == reference.encode(text, add_special_tokens=False).ids
  assert tok.decode(tok.encode(text) + [tokenizers.EOS_ID] + tok.encode("she")) == text
  assert run.encode_source(text)[-1] == tokenizers.EOS_ID  # T5's inputs end with </s> too
  [out] = run.generate_text(["the cat"])
  assert isinstance(out, str)
  assert predict.main(["--workdir", converted["flan"], "the cat"]) == 0
  assert capsys.readouterr().out.startswith("the cat\t")


def test_hf_id_offset_zero_needs_pad_and_eos_at_0_and_1(tmp_path):
  """data.hf_id_offset=0 on a tokenizer whose ids 0 and 1 are not special tokens (GPT-2-like:
  its id 0 is an ordinary piece) is a one-line error naming the key and the file."""
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Metaspace()
  tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=60, show_progress=False))
  tok.save(str(tmp_path / "tokenizer.json"))
  with pytest.raises(ValueError, match="data.hf_id_offset=0 needs") as info:
    tokenizers.build("hf", [], hf_tokenizer=str(tmp_path), hf_id_offset=0)
  assert "\n" not in str(info.value) and "tokenizer.json" in str(info.value)


def test_cli_from_hf_and_to_hf(hf_dirs, converted_cli, tmp_path):
  """The command line (`python -m transformer.convert`'s main): --from_hf (the fixture every other
  test reads) and then --workdir=OUT --to_hf=DIR2 each exit 0 with one summary line naming T5,
  and DIR2 holds the untied lm_head bitwise."""
  directory, model = hf_dirs["flan"]
  out, stdout = converted_cli["flan"]
  back = str(tmp_path / "back")
  assert stdout.strip().splitlines() == [f"wrote {out}: T5 with 2+3 layers, d_model 32, "
                                         f"vocabulary {VOCAB} (T5's ids), untied head"]
  capture = io.StringIO()
  with contextlib.redirect_stdout(capture):
    assert convert.main([f"--workdir={out}", f"--to_hf={back}"]) == 0
  assert capture.getvalue().strip().splitlines() == [
      f"wrote {back}: T5 with 2+3 layers, vocabulary {VOCAB}"]
  from safetensors.numpy import load_file
  weights = load_file(os.path.join(back, "model.safetensors"))
  assert np.array_equal(weights["lm_head.weight"], model.lm_head.weight.detach().numpy())


def test_unmappable_configs_are_one_line_errors_naming_the_key(converted, tmp_path, capsys):
  """--to_hf of an encoder-decoder run that is not T5-shaped (sinusoidal positions) names
  model.positional; --from_hf of a T5 with a feed-forward we lack ("gated-relu") names
  feed_forward_proj, and one whose decoder starts from another token names
  decoder_start_token_id; each is exit status 1 and one line on stderr."""
  bad = tmp_path / "sinusoidal"
  bad.mkdir()
  with open(os.path.join(converted["flan"], "config.json")) as f:
    cfg = json.load(f)
  cfg["model"]["positional"] = "sinusoidal"
  (bad / "config.json").write_text(json.dumps(cfg))
  assert convert.main(["--workdir", str(bad), "--to_hf", str(tmp_path / "x")]) == 1
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "model.positional='sinusoidal'" in err
  for key, value in (("feed_forward_proj", "gated-relu"), ("decoder_start_token_id", 2)):
    source = tmp_path / key
    source.mkdir()
    hf = dict(model_type="t5", vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=48, num_layers=2,
              num_heads=4, feed_forward_proj="gated-gelu")
    (source / "config.json").write_text(json.dumps(hf | {key: value}))
    assert convert.main(["--from_hf", str(source), "--workdir", str(tmp_path / "y")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{key}={value!r}" in err
  with pytest.raises(convert.ConvertError, match="model.scale_attention_logits=True"):
    t5.hf_config(dataclasses.replace(
        transformer.restore(converted["t5"]).config.model, scale_attention_logits=True))


@pytest.mark.slow  # a train.py subprocess: ~100 s on 2 shared cores
def test_fine_tuning_a_converted_t5_then_exporting_it(hf_dirs, converted, runs, tmp_path):
  """`train.py --config=configs/g2p.py:tiny --init_from=<converted T5>` on a seq2seq TSV task
  trains the T5 itself (its model config and 'hf' tokenizer with T5's ids carry over; g2p's do
  not), the training loss falls from the converted model's, and --to_hf of the fine-tuned run
  gives Hugging Face logits equal to ours to 1e-4."""
  lines = [f"{s}\t{s.upper()}" for s in TEXT]
  (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n")
  (tmp_path / "dev.tsv").write_text("\n".join(lines[:20]) + "\n")
  workdir = str(tmp_path / "tuned")
  cmd = [sys.executable, "train.py", "--config=configs/g2p.py:tiny", f"--workdir={workdir}",
         f"--init_from={converted['flan']}", "--config.data.dataset=tsv_pairs",
         f"--config.data.train_file={tmp_path / 'train.tsv'}",
         f"--config.data.dev_file={tmp_path / 'dev.tsv'}",
         f"--config.data.data_dir={tmp_path / 'tfds'}", "--config.data.batch_size=8",
         "--config.train.num_steps=8", "--config.train.log_every_steps=1",
         "--config.train.warmup_steps=0", "--config.eval.every_steps=8",
         "--config.eval.num_batches=1", "--config.eval.num_decode_examples=4",
         "--config.checkpoint.every_steps=8"]
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]
  tuned = transformer.restore(workdir)
  assert tuned.config.model == dataclasses.replace(
      runs["flan"].config.model, dropout_rate=tuned.config.model.dropout_rate,
      attention_dropout_rate=tuned.config.model.attention_dropout_rate,
      ffn_dropout_rate=tuned.config.model.ffn_dropout_rate)
  assert tuned.target_tokenizer == runs["flan"].target_tokenizer
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    losses = [m["train/loss"] for m in map(json.loads, f) if "train/loss" in m]
  assert len(losses) == 8 and losses[-1] < losses[0] - 0.1
  convert.to_hf(workdir, str(tmp_path / "hf"))
  model = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "hf")).eval()
  (inputs, inputs_mask), (targets, targets_mask) = batch(seed=3)
  want = hf_logits(model, inputs, inputs_mask, targets)
  got = our_logits(tuned, inputs, targets)
  real = targets_mask.astype(bool)
  assert np.abs(got[real] - want[real]).max() <= 1e-4
