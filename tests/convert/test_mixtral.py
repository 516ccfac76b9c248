"""Hugging Face Mixtral <-> workdir (transformer/convert/mixtral.py), checked against Hugging Face
itself.

Everything is offline: tiny MixtralForCausalLM models (2 layers, d_model 64, 4 query heads and 2
kv heads, 4 SwiGLU experts of hidden 96, top-2) are built from transformers' MixtralConfig with
every weight randomised (RMSNorm scales around 1), saved with save_pretrained (the hub's
per-expert layout) next to a BPE tokenizer trained here, then converted. "mixtral" has a sliding
window of 4, shorter than every input; "mixtral_trained" has none and is trained for a few Adam
steps in torch (router and experts away from their init). The reference is always Hugging Face's
own forward pass, generate or load_balancing_loss_func, never our code.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

# The Llama family's conversions (its tokenizer and torch training loop), batch and
# log-probabilities (one concept in one place: Mixtral is that decoder with another feed-forward).
from test_llama import (  # noqa: E402
    BOS, EOS, assert_greedy_equals_generate, batch, conversions, exported_rows,
    fine_tune_and_export, log_probs, _perturbed)

from bench_loader import load_benchmark  # noqa: E402

import transformer  # noqa: E402
from transformer import convert  # noqa: E402
from transformer.config import model_config, TrainConfig  # noqa: E402
from transformer.convert import llama, mixtral  # noqa: E402
from transformer.data import tokenizers  # noqa: E402
from transformer.model import moe  # noqa: E402
from transformer.train import optim, steps  # noqa: E402

from transformers.models.mixtral import modeling_mixtral  # noqa: E402

bench = load_benchmark("hf_probabilities")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WINDOW = 4
SIZES = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, bos_token_id=BOS,
             eos_token_id=EOS, rms_norm_eps=1e-5, num_local_experts=4, num_experts_per_tok=2,
             output_router_logits=True, router_aux_loss_coef=0.02)
VARIANTS = {"mixtral": dict(sliding_window=WINDOW), "mixtral_trained": dict(sliding_window=None)}


def hf_model(variant: str, vocab: int) -> torch.nn.Module:
  """A tiny random Mixtral (hf_probabilities.randomize: the router too, routing far from
  uniform)."""
  return bench.randomize(transformers.MixtralForCausalLM(transformers.MixtralConfig(
      vocab_size=vocab, **(SIZES | VARIANTS[variant]))))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """The module's conversions of hf_model's variants (test_llama's `conversions`)."""
  return conversions(tmp_path_factory.mktemp("mixtral"), hf_model)


@pytest.mark.parametrize("variant", VARIANTS)
def test_log_probabilities_equal_hugging_face(converted, variant):
  """HF -> ours: next-token log-probabilities equal Hugging Face's to 1e-4 at every real position
  of right-padded rows (longer than the window), with the experts' routing exercised: every
  expert is some token's choice."""
  _, model, _, _, run = converted(variant)
  ids, mask = batch(model.config.vocab_size)
  got, want = log_probs(run, model, ids, mask)
  assert got.shape == want.shape and got.shape[0] == mask.sum()
  assert np.abs(got - want).max() <= 1e-4
  with torch.no_grad():
    router = model(input_ids=torch.tensor(ids), output_router_logits=True).router_logits
  chosen = {int(e) for layer in router for e in torch.topk(layer, 2, -1).indices.flatten()}
  assert chosen == set(range(4))


def test_converted_config_maps_mixtrals_knobs(converted):
  """Mixtral's keys are ordinary knobs: a dropless, renormalised top-2 mixture of 4 SwiGLU
  experts, the window, and the balance-loss coefficient scaled by top_k / layers."""
  m, t = converted("mixtral")[4].config.model, converted("mixtral")[4].config.train
  assert (m.ffn, m.moe_expert_ffn, m.moe_num_experts, m.moe_top_k) == ("moe", "swiglu", 4, 2)
  assert m.moe_capacity_factor == 0 and m.moe_renormalize and m.moe_num_shared_experts == 0
  assert m.sliding_window == WINDOW and m.num_kv_heads == 2 and m.mlp_dim == 96
  assert t.moe_balance_loss == pytest.approx(0.02 * 2 / 2) and t.moe_z_loss == 0
  assert converted("mixtral_trained")[4].config.model.sliding_window == 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_generation_equals_hugging_face_generate(converted, variant):
  """Our cached greedy decoding (batched prompts of different lengths) emits
  generate(do_sample=False)'s tokens for 12 steps, Hugging Face given <s> before each prompt,
  left-padded the same."""
  _, model, _, _, run = converted(variant)
  assert_greedy_equals_generate(run, model, output_router_logits=False)


@pytest.mark.parametrize("variant", VARIANTS)
def test_round_trip_is_bitwise_equal(converted, variant, tmp_path):
  """HF -> ours -> HF: every tensor Hugging Face loads back is bitwise the original's, the file
  holds the hub's per-expert layout, and config.json's architecture and training keys are
  unchanged."""
  directory, model, _, workdir, _ = converted(variant)
  convert.to_hf(workdir, str(tmp_path / "back"))
  back = transformers.MixtralForCausalLM.from_pretrained(str(tmp_path / "back"))
  original, again = model.state_dict(), back.state_dict()
  assert sorted(original) == sorted(again)
  for key, value in original.items():
    assert torch.equal(value, again[key]), key
  from safetensors.numpy import load_file
  written = load_file(str(tmp_path / "back" / "model.safetensors"))
  assert "model.layers.1.block_sparse_moe.experts.3.w2.weight" in written
  with open(os.path.join(directory, "config.json")) as f:
    source = json.load(f)
  with open(tmp_path / "back" / "config.json") as f:
    config = json.load(f)
  for key in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_parameters",
              "sliding_window", "tie_word_embeddings", "bos_token_id", "eos_token_id",
              "num_local_experts", "num_experts_per_tok", "router_aux_loss_coef",
              "output_router_logits", "router_jitter_noise", "architectures"):
    assert config.get(key) == source.get(key), key


@pytest.mark.slow  # default coverage: the round trips and the log-probabilities
def test_fine_tune_step_then_export_scores_like_hugging_face(converted, tmp_path):
  """One step of our train step on the converted model (its balance loss in the objective)
  changes every expert's weights; the export of the result loads in Hugging Face and scores like
  ours to 1e-4, and converting it back gives the same parameters bitwise."""
  _, model, _, workdir, run = converted("mixtral_trained")
  cfg = run.config
  tx = optim.make_optimizer(cfg.train, cfg.model.d_model)
  state = steps.TrainState(step=jnp.zeros((), jnp.int32), params=run.params,
                           opt_state=tx.init(run.params), rng=steps.key_data(jax.random.key(0)))
  rng = np.random.default_rng(0)
  targets = rng.integers(tokenizers.NUM_SPECIAL, cfg.model.vocab_size, (4, 16)).astype(np.int32)
  state, metrics = jax.jit(steps.make_train_step(cfg, run.model, tx))(state, dict(
      targets=targets))
  assert np.isfinite(float(metrics["loss"])) and float(metrics["moe_aux_loss"]) > 0
  wi = lambda p: np.asarray(p["decoder"]["layers_0"]["ffn"]["wi_gate"]["kernel"])
  changed = np.abs(wi(state.params) - wi(run.params)).max(axis=(1, 2))
  assert (changed > 0).all()
  ours, exported = str(tmp_path / "ours"), str(tmp_path / "exported")
  with open(os.path.join(workdir, convert.CONVERTED_FROM)) as f:
    source = json.load(f)
  target = tokenizers.load(os.path.join(workdir, "tokenizers", "target"))
  convert.write_workdir(cfg, state.params, target, ours, source)
  convert.to_hf(ours, exported)
  hf = transformers.MixtralForCausalLM.from_pretrained(exported).eval()
  tuned = run.__class__(cfg, run.model, state.params, run.task, run.step, run.workdir)
  untied = not cfg.model.tie_embeddings
  got, want = log_probs(tuned, hf, *batch(hf.config.vocab_size), start_token=untied)
  assert np.abs(got - want).max() <= 1e-4
  convert.from_hf(exported, str(tmp_path / "again"))
  again = transformer.restore(str(tmp_path / "again"))
  places = llama.our_ids(hf.config.to_dict())
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(state.params)[0],
                          jax.tree.leaves(again.params)):
    a, b = exported_rows(path, a, places, BOS, untied), np.asarray(b)
    if a.shape[0] == cfg.model.vocab_size:
      a, b = a[places], b[places]
    elif a.ndim == 2 and a.shape[1] == cfg.model.vocab_size:
      a, b = a[:, places], b[:, places]
    assert np.array_equal(a, b), jax.tree_util.keystr(path)


def test_ours_to_hf_keeps_new_weights_bitwise(converted, tmp_path):
  """ours -> HF for weights that are all new (as after fine-tuning): Hugging Face's model of the
  export scores like ours to 1e-4."""
  _, model, _, workdir, run = converted("mixtral")
  params = _perturbed(run.params)
  ours, exported = str(tmp_path / "ours"), str(tmp_path / "exported")
  with open(os.path.join(workdir, convert.CONVERTED_FROM)) as f:
    source = json.load(f)
  target = tokenizers.load(os.path.join(workdir, "tokenizers", "target"))
  convert.write_workdir(run.config, params, target, ours, source)
  convert.to_hf(ours, exported)
  hf = transformers.MixtralForCausalLM.from_pretrained(exported).eval()
  new = run.__class__(run.config, run.model, params, run.task, run.step, run.workdir)
  got, want = log_probs(new, hf, *batch(hf.config.vocab_size),
                        start_token=not run.config.model.tie_embeddings)
  assert np.abs(got - want).max() <= 1e-4


def test_transformers_in_memory_layout_reads_like_the_hub_layout(converted):
  """A state dict in transformers' fused layout (gate_up_proj, down_proj, mlp.gate) gives the
  same parameters as the file's per-expert layout."""
  _, model, _, _, run = converted("mixtral")
  fused = {k: v.numpy() for k, v in model.state_dict().items()}
  hf = model.config.to_dict()
  got = mixtral.params_from_hf(fused, run.config.model, hf)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(run.params)):
    assert np.array_equal(np.asarray(a), np.asarray(b))


def test_balance_loss_coefficient_against_hugging_faces_loss():
  """Hugging Face's load_balancing_loss_func is top_k times our one-layer balance loss, and
  top_k / L times our L layers' sum when each expert's count is the same in every layer (the
  second layer's logits are the first's doubled: the same choices, other probabilities)."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(40, 4)).astype(np.float32)
  k = 2
  ours = lambda x: float(moe.aux_losses(jnp.asarray(x), *moe.route(jnp.asarray(x), k, True)[::2]
                                        )["balance_loss"])
  theirs = lambda *xs: float(modeling_mixtral.load_balancing_loss_func(
      tuple(torch.tensor(x) for x in xs), 4, k))
  assert theirs(logits) == pytest.approx(k * ours(logits), rel=1e-5)
  layers = (logits, 2 * logits)
  assert theirs(*layers) == pytest.approx(k / 2 * sum(map(ours, layers)), rel=1e-5)
  hf = dict(num_experts_per_tok=k, num_hidden_layers=2, router_aux_loss_coef=0.02,
            output_router_logits=True)
  t = mixtral.train_overrides(hf)
  assert t["moe_balance_loss"] == 0.02 and mixtral.train_overrides(
      hf | dict(output_router_logits=False))["moe_balance_loss"] == 0
  m = model_config(**mixtral.model_overrides(dict(
      model_type="mixtral", vocab_size=50, **(SIZES | dict(num_hidden_layers=2)))))
  assert mixtral.hf_training(TrainConfig(moe_balance_loss=0.3), m, {}) == dict(
      output_router_logits=True, router_aux_loss_coef=0.3)
  three = hf | dict(num_hidden_layers=3)  # k / L = 2 / 3: scaled there and back
  ours = mixtral.train_overrides(three)["moe_balance_loss"]
  assert ours == pytest.approx(0.02 * 2 / 3)
  m3 = model_config(**mixtral.model_overrides(dict(model_type="mixtral", vocab_size=50,
                                                   **(SIZES | dict(num_hidden_layers=3)))))
  assert mixtral.hf_training(TrainConfig(moe_balance_loss=ours), m3, {})[
      "router_aux_loss_coef"] == 0.02
  assert mixtral.hf_training(TrainConfig(moe_balance_loss=0.0), m3, three) == dict(
      output_router_logits=False, router_aux_loss_coef=0.02)


def test_cli_from_hf_and_to_hf(converted, tmp_path):
  """`python -m transformer.convert --from_hf=DIR --workdir=OUT`, then `--to_hf=DIR2`, as
  subprocesses: each exits 0 with one summary line naming Mixtral."""
  directory, model, _, _, _ = converted("mixtral")
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  out, back = str(tmp_path / "run"), str(tmp_path / "back")
  script = (f"{sys.executable} -m transformer.convert --from_hf={directory} --workdir={out} && "
            f"{sys.executable} -m transformer.convert --workdir={out} --to_hf={back}")
  done = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  lines = done.stdout.strip().splitlines()
  assert len(lines) == 2 and lines[0].startswith(f"wrote {out}: Mixtral-shaped")
  assert lines[1].startswith(f"wrote {back}: Mixtral with 2 layers, 4 experts")


@pytest.mark.slow
def test_fine_tuning_a_converted_mixtral_from_the_command_line(converted, tmp_path):
  """`--from_hf --text_file`, `train.py --init_from` for 8 steps (the training loss falls, the
  balance loss is logged), then `--to_hf`: Hugging Face's MixtralForCausalLM of the export scores
  like the fine-tuned run to 1e-4."""
  directory = converted("mixtral")[0]
  tuned, back, logged = fine_tune_and_export(directory, tmp_path)
  losses = [m["train/loss"] for m in logged]
  assert len(losses) == 8 and losses[-1] < losses[0] - 0.1
  assert all(m["train/moe_balance_loss"] > 0 for m in logged)
  run = transformer.restore(tuned)
  assert run.config.model.ffn == "moe" and run.config.model.moe_capacity_factor == 0
  model = transformers.MixtralForCausalLM.from_pretrained(back).eval()
  got, want = log_probs(run, model, *batch(model.config.vocab_size))
  assert np.abs(got - want).max() <= 1e-4


def _hf_dir(tmp_path, config: dict) -> str:
  directory = tmp_path / "hf"
  directory.mkdir()
  (directory / "config.json").write_text(json.dumps(config))
  (directory / "model.safetensors").write_bytes(b"")
  return str(directory)


@pytest.mark.parametrize("change,named", [
    (dict(router_jitter_noise=0.1), "router_jitter_noise=0.1"),
    (dict(num_experts_per_tok=5), "num_experts_per_tok=5"),
    (dict(num_local_experts=0), "num_local_experts=0"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(sliding_window=-3), "sliding_window=-3")])
def test_unmappable_configs_are_one_line_errors_naming_the_key(tmp_path, capsys, change, named):
  """--from_hf of a Mixtral config.json we cannot map exits 1 with one line naming the key."""
  config = dict(model_type="mixtral", vocab_size=100, **SIZES) | change
  argv = ["--from_hf", _hf_dir(tmp_path, config), "--workdir", str(tmp_path / "out")]
  assert convert.main(argv) == 1
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and named in err, err


def test_missing_expert_weight_is_a_convert_error(converted):
  """A state dict without one expert's tensor: a ConvertError naming it."""
  _, model, _, _, run = converted("mixtral")
  state = mixtral.hub_layout({k: v.numpy() for k, v in model.state_dict().items()})
  del state["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
  with pytest.raises(convert.ConvertError, match="experts.2.w3.weight"):
    mixtral.params_from_hf(state, run.config.model, model.config.to_dict())


def test_export_picks_mixtral_and_refuses_knobs_it_lacks():
  """--to_hf of an RMSNorm decoder with model.ffn=moe goes to Mixtral; a capacity factor (Mixtral
  drops nothing), shared experts or GELU experts are ConvertErrors naming the key."""
  base = dict(arch="decoder_only", positional="rope", norm="rmsnorm", norm_position="pre",
              ffn="moe", moe_capacity_factor=0.0, scale_embeddings=False, use_bias=False,
              vocab_size=50, ffn_dropout_rate=0.0)
  assert convert.family_of_config(model_config(**base)) is mixtral
  assert convert.family_of_config(model_config(**(base | dict(ffn="swiglu")))) is llama
  for change, named in ((dict(moe_capacity_factor=1.25), "model.moe_capacity_factor=1.25"),
                        (dict(moe_num_shared_experts=1), "model.moe_num_shared_experts=1"),
                        (dict(moe_expert_ffn="gelu"), "model.moe_expert_ffn='gelu'")):
    with pytest.raises(convert.ConvertError, match=named):
      mixtral.hf_config(model_config(**(base | change)))
  out = mixtral.hf_config(model_config(**(base | dict(moe_num_experts=8, sliding_window=16))))
  assert (out["model_type"], out["num_local_experts"], out["sliding_window"]) == (
      "mixtral", 8, 16)
