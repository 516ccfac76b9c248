"""Hugging Face Llama 2 / Llama 3 / Mistral / Qwen2 <-> workdir (transformer/convert/llama.py),
checked against Hugging Face itself.

Everything is offline: tiny models (2 layers, d_model 64, 4 query heads; grouped-query with 2
kv heads except Llama 2's multi-head) are built from transformers' config classes with every
weight randomised (RMSNorm scales around 1, Qwen2's q/k/v biases non-zero), saved with
save_pretrained next to a BPE tokenizer trained here with Llama's <unk> <s> </s> at 0, 1, 2, then
converted. Llama 3 has Llama 3.1's RoPE scaling (an original length of 16, so all three
frequency bands occur) and a tied head; Mistral a sliding window of 4, shorter than every input;
one Llama 3 is also trained for a few Adam steps in torch (weights away from their init). The
reference is always Hugging Face's own forward pass or generate, never our code.
"""

import dataclasses
import functools
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from bench_loader import load_benchmark  # noqa: E402

import transformer  # noqa: E402
from transformer import convert  # noqa: E402
from transformer.config import excluded_ids, model_config  # noqa: E402
from transformer.convert import llama  # noqa: E402
from transformer.data import tokenizers  # noqa: E402
from transformer.infer import evaluation  # noqa: E402

bench = load_benchmark("hf_probabilities")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPECIALS = ["<unk>", "<s>", "</s>"]
BOS, EOS = 1, 2
WINDOW = 4
SIZES = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, bos_token_id=BOS,
             eos_token_id=EOS, rms_norm_eps=1e-5)
VARIANTS = {
    "llama2": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
               dict(num_key_value_heads=4)),
    "llama3": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(
        tie_word_embeddings=True, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM,
                dict(sliding_window=WINDOW)),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(tie_word_embeddings=True)),
}
NAMES = [*VARIANTS, "llama3_trained"]


def tokenizer():
  """A byte-pair tokenizer of ~100 ids with Llama's specials first."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
  tok.train_from_iterator(bench.corpus(), trainers.BpeTrainer(
      vocab_size=100, special_tokens=SPECIALS, show_progress=False))
  return tok


def hf_model(variant: str, vocab: int) -> torch.nn.Module:
  """A tiny random model of `variant` (hf_probabilities.randomize)."""
  config_cls, model_cls, extra = VARIANTS[variant.removesuffix("_trained")]
  return bench.randomize(model_cls(config_cls(vocab_size=vocab, **(SIZES | extra))))


def train(model, tok, steps: int = 20) -> torch.nn.Module:
  """`steps` Adam steps (lr 3e-3) of causal LM on <s> line </s> batches of the corpus."""
  lines = bench.corpus()
  optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
  model.train()
  for step in range(steps):
    rows = [[BOS] + tok.encode(lines[(step * 16 + i) % len(lines)]).ids + [EOS]
            for i in range(16)]
    width = max(map(len, rows))
    ids = torch.tensor([r + [EOS] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
  return model.eval()


def conversions(root, build):
  """variant -> (HF directory, HF model, tokenizer, our workdir, restored Run): the HF model
  `build(variant, vocab_size)` (trained a few steps for a '_trained' variant), saved in root and
  converted, each once."""
  cache = {}

  def get(variant: str):
    if variant not in cache:
      torch.manual_seed(0)
      tok = tokenizer()
      model = build(variant, tok.get_vocab_size())
      if variant.endswith("_trained"):
        model = train(model, tok)
      directory = str(root / variant)
      model.save_pretrained(directory)
      tok.save(os.path.join(directory, "tokenizer.json"))
      workdir = directory + "_ours"
      convert.from_hf(directory, workdir)
      cache[variant] = directory, model, tok, workdir, transformer.restore(workdir)
    return cache[variant]

  return get


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """The module's conversions of hf_model's variants."""
  return conversions(tmp_path_factory.mktemp("llama"), hf_model)


def log_softmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def batch(vocab: int):
  """ids [3, 14]: <s> then 13, 8 and 4 random ids, right-padded (all longer than the window)."""
  rng = np.random.default_rng(0)
  ids, mask = np.full((3, 14), EOS), np.zeros((3, 14), np.int64)
  for r, n in enumerate((13, 8, 4)):
    ids[r, 0], mask[r, :n + 1] = BOS, 1
    ids[r, 1:n + 1] = rng.integers(3, vocab, n)
  return ids, mask


def log_probs(run, model, ids, mask, start_token=True):
  """(ours, Hugging Face's) log-probabilities [real positions, HF vocabulary]: ours the
  log-softmax over our whole vocabulary (excluded ids included) read at each HF id's place; our
  start token 0 in place of <s> if `start_token`, else <s>'s own place."""
  places = llama.our_ids(model.config.to_dict())
  ours = np.where(mask, places[ids], 0)
  if start_token:
    ours[:, 0] = 0
  decode = jax.jit(functools.partial(run.model.apply, method="decode"))
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  logits = np.asarray(decode({"params": run.params}, ours, positions, mask.astype(np.int32)))
  with torch.no_grad():
    want = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  real = mask.astype(bool)
  return log_softmax(logits)[..., places][real], log_softmax(want)[real]


@pytest.mark.parametrize("variant", NAMES)
def test_log_probabilities_equal_hugging_face(converted, variant):
  """HF -> ours: next-token log-probabilities (and probabilities) equal Hugging Face's to 1e-4 at
  every real position of right-padded rows longer than Mistral's window; our ids without a
  Hugging Face place are exactly the excluded ids."""
  _, model, _, _, run = converted(variant)
  ids, mask = batch(model.config.vocab_size)
  got, want = log_probs(run, model, ids, mask)
  assert got.shape == want.shape and got.shape[0] == mask.sum()
  assert np.abs(got - want).max() <= 1e-4
  assert np.abs(np.exp(got) - np.exp(want)).max() <= 1e-4
  places = llama.our_ids(model.config.to_dict())
  others = np.setdiff1d(np.arange(run.config.model.vocab_size), places)
  assert list(others) == list(excluded_ids(run.config.model))


def test_converted_configs_carry_each_familys_knobs(converted):
  """Each variant's detail is an ordinary model knob: Llama 2 multi-head (fused qkv), Llama 3's
  RoPE scaling and tied head, Mistral's sliding window, Qwen2's q/k/v biases."""
  m = {v: converted(v)[4].config.model for v in VARIANTS}
  assert m["llama2"].num_kv_heads == 4 and "qkv" in converted("llama2")[4].params["decoder"][
      "layers_0"]["self_attention"]
  assert (m["llama3"].rope_scaling, m["llama3"].rope_original_max_len) == ("llama3", 16)
  assert m["llama3"].rope_base == 500000.0 and m["llama3"].tie_embeddings
  assert m["mistral"].sliding_window == WINDOW and m["mistral"].num_kv_heads == 2
  assert m["qwen2"].qkv_bias and not m["qwen2"].use_bias
  assert all(x.norm == "rmsnorm" and x.ffn == "swiglu" and x.positional == "rope"
             for x in m.values())


def assert_greedy_equals_generate(run, model, **generate_kwargs) -> None:
  """Our cached greedy decoding of batched prompts of different lengths (start token +
  left-padded prefill) emits generate(do_sample=False)'s tokens for 12 steps, Hugging Face given
  <s> before each prompt, left-padded the same."""
  steps = 12
  prompts = [[5, 17, 30, 8, 41], [22, 3], [60, 9, 62]]
  places = llama.our_ids(model.config.to_dict())
  back = {int(o): h for h, o in enumerate(places)}
  greedy = dataclasses.replace(run.config.eval.decode, method="greedy", max_decode_len=steps)
  ours, _ = evaluation.decode_batches(run.config, run.model, run.params,
                                      [[int(places[i]) for i in p] for p in prompts], greedy,
                                      eos_id=tokenizers.EOS_ID, batch_size=4)
  width = max(map(len, prompts)) + 1
  ids, mask = np.full((3, width), EOS), np.zeros((3, width), np.int64)
  for r, p in enumerate(prompts):
    ids[r, width - len(p) - 1:], mask[r, width - len(p) - 1:] = [BOS, *p], 1
  with torch.no_grad():
    out = model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                         do_sample=False, max_new_tokens=steps, eos_token_id=EOS,
                         pad_token_id=EOS, **generate_kwargs).numpy()[:, width:]
  for r in range(3):
    hf = list(out[r])
    hf = hf[:hf.index(EOS)] if EOS in hf else hf
    assert [back[t] for t in ours[r]] == hf


@pytest.mark.parametrize("variant", NAMES)
def test_greedy_generation_equals_hugging_face_generate(converted, variant):
  """Our cached greedy decoding (batched prompts of different lengths: start token + left-padded
  prefill; Mistral's ring cache of 4 slots) emits generate(do_sample=False)'s tokens for 12 steps,
  Hugging Face given <s> before each prompt, left-padded the same."""
  _, model, _, _, run = converted(variant)
  assert_greedy_equals_generate(run, model)


@pytest.mark.parametrize("variant", NAMES)
def test_round_trip_is_bitwise_equal(converted, variant, tmp_path):
  """HF -> ours -> HF: every tensor of the state dict Hugging Face loads back is bitwise equal to
  the original's, and the architecture keys of config.json are unchanged."""
  directory, model, _, workdir, _ = converted(variant)
  convert.to_hf(workdir, str(tmp_path / "back"))
  back = type(model).from_pretrained(str(tmp_path / "back"))
  original, again = model.state_dict(), back.state_dict()
  assert sorted(original) == sorted(again)
  for key, value in original.items():
    assert torch.equal(value, again[key]), key
  with open(os.path.join(directory, "config.json")) as f:
    source = json.load(f)
  with open(tmp_path / "back" / "config.json") as f:
    written = json.load(f)
  for key in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
              "rope_parameters", "sliding_window", "tie_word_embeddings", "bos_token_id",
              "eos_token_id", "attention_bias", "mlp_bias", "use_sliding_window"):
    assert written.get(key) == source.get(key), key


def test_export_tells_autotokenizer_its_special_tokens(converted, tmp_path):
  """--to_hf writes tokenizer_config.json beside tokenizer.json: transformers' AutoTokenizer of
  the export knows <s>, </s>, <unk> at the source's ids and the model's length."""
  _, model, tok, workdir, _ = converted("llama2")
  convert.to_hf(workdir, str(tmp_path / "back"))
  auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "back"))
  assert (auto.bos_token, auto.eos_token, auto.unk_token) == ("<s>", "</s>", "<unk>")
  assert (auto.bos_token_id, auto.eos_token_id, auto.unk_token_id) == (BOS, EOS, 0)
  assert auto.model_max_length == model.config.max_position_embeddings
  assert auto("the cat sees", add_special_tokens=False).input_ids == tok.encode("the cat sees").ids


def _perturbed(params, seed: int = 7):
  """New random arrays of the same shapes (norm scales around 1), as after fine-tuning."""
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: np.float32(1 + 0.3 * rng.normal(size=np.shape(x)))
      if "norm" in jax.tree_util.keystr(path)
      else np.float32(rng.normal(size=np.shape(x)) * (np.std(x) or 0.1)), params)


def exported_rows(path, x, places: np.ndarray, bos: int, untied: bool) -> np.ndarray:
  """Parameter `x` (at tree `path`) as the export holds it: an untied embedding's row at <s>'s
  place is our start token's (llama.py's module doc)."""
  x = np.array(x)
  if untied and "token_embed" in jax.tree_util.keystr(path):
    x[places[bos]] = x[0]
  return x


@pytest.mark.parametrize("variant", VARIANTS)
def test_ours_to_hf_to_ours_is_bitwise_and_keeps_probabilities(converted, variant, tmp_path):
  """ours -> HF -> ours for a workdir whose weights are all new (as after fine-tuning): every
  parameter Hugging Face holds comes back bitwise (vocabulary rows at their places), the model
  config is the same, and Hugging Face's model of the export scores like ours to 1e-4 (with our
  start token: an untied export's <s> embedding row is its row; a tied one's is <s>'s own, which
  ours then reads in its place)."""
  _, model, _, workdir, run = converted(variant)
  params = _perturbed(run.params)
  ours = str(tmp_path / "ours")
  with open(os.path.join(workdir, convert.CONVERTED_FROM)) as f:
    source = json.load(f)
  target = tokenizers.load(os.path.join(workdir, "tokenizers", "target"))
  convert.write_workdir(run.config, params, target, ours, source)
  exported = str(tmp_path / "exported")
  convert.to_hf(ours, exported)
  hf_model = type(model).from_pretrained(exported).eval()
  convert.from_hf(exported, str(tmp_path / "again"))
  again = transformer.restore(str(tmp_path / "again"))
  assert again.config.model == run.config.model
  places = llama.our_ids(hf_model.config.to_dict())
  vocab, untied = run.config.model.vocab_size, not run.config.model.tie_embeddings
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                          jax.tree.leaves(again.params)):
    a, b = exported_rows(path, a, places, BOS, untied), np.asarray(b)
    if a.shape[0] == vocab:
      a, b = a[places], b[places]
    elif a.ndim == 2 and a.shape[1] == vocab:
      a, b = a[:, places], b[:, places]
    assert np.array_equal(a, b), jax.tree_util.keystr(path)
  got, want = log_probs(run.__class__(run.config, run.model, params, run.task, run.step,
                                      run.workdir), hf_model,
                        *batch(hf_model.config.vocab_size), start_token=untied)
  assert np.abs(got - want).max() <= 1e-4


def test_scanned_layers_export_like_unrolled_ones(converted):
  """A run trained with model.scan_layers exports the same state dict as the layers it stacks."""
  run = converted("mistral")[4]
  params = jax.tree.map(np.asarray, run.params)
  decoder = dict(params["decoder"])
  layers = [decoder.pop(f"layers_{i}") for i in range(run.config.model.num_decoder_layers)]
  scanned = {**params, "decoder": {**decoder, "layers": jax.tree.map(
      lambda *xs: np.stack(xs), *layers)}}
  want = llama.hf_from_params(params, run.config.model)
  got = llama.hf_from_params(scanned, run.config.model)
  assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)


def test_a_missing_tensor_is_a_convert_error_naming_it(converted):
  """Any tensor the state dict lacks (here one layer's up projection, and the final norm) is a
  ConvertError naming it, not a KeyError from deep inside."""
  _, model, _, _, run = converted("llama3")
  for key in ("model.layers.1.mlp.up_proj.weight", "model.norm.weight"):
    state = {k: v.numpy() for k, v in model.state_dict().items() if k != key}
    with pytest.raises(convert.ConvertError, match=f"the Llama weights have no {key}"):
      llama.params_from_hf(state, run.config.model, model.config.to_dict())


def test_cli_from_hf_and_to_hf(converted, tmp_path):
  """`python -m transformer.convert --from_hf=DIR --workdir=OUT`, then `--workdir=OUT
  --to_hf=DIR2`, as subprocesses: each exits 0 with one summary line naming the family, and
  DIR2 holds Qwen2's weights bitwise."""
  directory, model, _, _, _ = converted("qwen2")
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  out, back = str(tmp_path / "run"), str(tmp_path / "back")
  script = (f"{sys.executable} -m transformer.convert --from_hf={directory} --workdir={out} && "
            f"{sys.executable} -m transformer.convert --workdir={out} --to_hf={back}")
  done = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  lines = done.stdout.strip().splitlines()
  assert len(lines) == 2 and lines[0].startswith(f"wrote {out}: Qwen2")
  assert lines[1].startswith(f"wrote {back}: Qwen2")
  from safetensors.numpy import load_file
  weights = load_file(os.path.join(back, "model.safetensors"))
  key = "model.layers.1.self_attn.k_proj.bias"
  assert np.array_equal(weights[key], model.state_dict()[key].numpy())


def _hf_dir(tmp_path, config: dict) -> str:
  directory = tmp_path / config["model_type"]
  directory.mkdir()
  (directory / "config.json").write_text(json.dumps(config))
  (directory / "model.safetensors").write_bytes(b"")
  return str(directory)


@pytest.mark.parametrize("change,named", [
    (dict(model_type="qwen2", use_sliding_window=True), "use_sliding_window=true"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
     "rope_type='yarn'"),
    (dict(attention_bias=True), "attention_bias=True"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(model_type="mistral", sliding_window=-3), "sliding_window=-3")])
def test_unmappable_configs_are_one_line_errors_naming_the_key(tmp_path, capsys, change, named):
  """--from_hf of a config.json this family cannot map exits 1 with one line naming the key."""
  config = dict(model_type="llama", vocab_size=100, **SIZES) | change
  argv = ["--from_hf", _hf_dir(tmp_path, config), "--workdir", str(tmp_path / "out")]
  assert convert.main(argv) == 1
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and named in err, err


def test_export_refuses_knobs_the_family_lacks():
  """--to_hf of a decoder with RMSNorm goes to this family; knobs it has no counterpart for are
  ConvertErrors naming the key: a GELU feed-forward, q/k/v biases with a sliding window."""
  base = dict(arch="decoder_only", positional="rope", norm="rmsnorm", norm_position="pre",
              ffn="swiglu", scale_embeddings=False, use_bias=False, vocab_size=50)
  assert convert.family_of_config(model_config(**base)) is llama
  with pytest.raises(convert.ConvertError, match="model.ffn='gelu'"):
    llama.hf_config(model_config(**(base | dict(ffn="gelu"))))
  with pytest.raises(convert.ConvertError, match="model.sliding_window=8 has no Qwen2"):
    llama.hf_config(model_config(**(base | dict(qkv_bias=True, sliding_window=8))))
  mistral = llama.hf_config(model_config(**(base | dict(sliding_window=8))))
  assert mistral["model_type"] == "mistral" and mistral["sliding_window"] == 8


def fine_tune_and_export(directory: str, tmp_path) -> tuple[str, str, list[dict]]:
  """`--from_hf DIRECTORY --text_file`, `train.py --init_from` for 8 steps, then `--to_hf`, as a
  user runs them; (the fine-tuned workdir, the export, its logged training rows)."""
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(bench.corpus()) + "\n")
  out, tuned, back = (str(tmp_path / name) for name in ("run", "tuned", "back"))
  data = f"--config.data.text_file={corpus} --config.data.data_dir={tmp_path / 'tfds'}"
  script = " && ".join([
      f"{sys.executable} -m transformer.convert --from_hf={directory} --workdir={out} "
      f"--text_file={corpus} --data_dir={tmp_path / 'tfds'}",
      f"{sys.executable} train.py --config=configs/lm.py:nanogpt_cpu --workdir={tuned} "
      f"--init_from={out} --config.data.dataset=text_files {data} "
      "--config.data.max_target_len=32 --config.data.max_source_len=32 "
      "--config.data.batch_size=8 --config.train.num_steps=8 --config.train.warmup_steps=0 "
      "--config.train.learning_rate=3e-3 --config.train.log_every_steps=1 "
      "--config.eval.every_steps=8 --config.eval.num_batches=1 --config.checkpoint.every_steps=8",
      f"{sys.executable} -m transformer.convert --workdir={tuned} --to_hf={back}"])
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  done = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]
  with open(os.path.join(tuned, "metrics.jsonl")) as f:
    logged = [m for m in map(json.loads, f) if "train/loss" in m]
  return tuned, back, logged


@pytest.mark.slow
def test_fine_tuning_a_converted_mistral_then_exporting_it(converted, tmp_path):
  """`--from_hf --text_file`, `train.py --init_from` for 8 steps (the training loss falls from the
  converted model's), then `--to_hf`: Hugging Face's MistralForCausalLM of the export scores like
  the fine-tuned run to 1e-4 on rows longer than the window."""
  directory, _, _, _, _ = converted("mistral")
  tuned, back, logged = fine_tune_and_export(directory, tmp_path)
  losses = [m["train/loss"] for m in logged]
  assert len(losses) == 8 and losses[-1] < losses[0] - 0.1
  run = transformer.restore(tuned)
  assert run.config.model.sliding_window == WINDOW
  model = transformers.MistralForCausalLM.from_pretrained(back).eval()
  got, want = log_probs(run, model, *batch(model.config.vocab_size))
  assert np.abs(got - want).max() <= 1e-4


@pytest.mark.parametrize("hf,want", [
    (dict(rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0}),
     dict(rope_base=5e5, rope_scaling="linear", rope_scaling_factor=2.0)),
    (dict(rope_theta=5e5, rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 8192}),
     dict(rope_base=5e5, rope_scaling="llama3", rope_scaling_factor=32.0,
          rope_original_max_len=8192)),
    (dict(rope_theta=1e6), dict(rope_base=1e6, rope_scaling="none")),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
     dict(rope_base=1e4, rope_scaling="none"))])
def test_rope_keys_of_older_and_newer_config_files(hf, want):
  """rope_theta + rope_scaling (config.json before transformers 5, `type` or `rope_type`) and
  rope_parameters map to the same model keys."""
  got = llama.rope_overrides(hf)
  assert {k: got[k] for k in want} == want


def test_a_list_of_end_of_sequence_ids_maps_its_first():
  """Llama 3 lists several end-of-sequence ids: the first takes our EOS, the others stay ids of
  their own; an export over that config.json keeps the list."""
  hf = dict(model_type="llama", vocab_size=100, **SIZES) | dict(eos_token_id=[7, 8])
  ids = llama.our_ids(hf)
  assert ids[7] == tokenizers.EOS_ID and ids[8] == 8 + tokenizers.NUM_SPECIAL
  m = model_config(**llama.model_overrides(hf))
  assert llama.hf_config(m, hf)["eos_token_id"] == [7, 8]
