r"""Hugging Face GPT-2 checkpoints <-> workdirs, with identical logits.

  python -m transformer.convert --from_hf=DIR --workdir=OUT [--text_file=CORPUS [--data_dir=D]]
  python -m transformer.convert --workdir=OUT --to_hf=DIR [--step=latest]

`--from_hf` reads a local Hugging Face directory (config.json, model.safetensors or
pytorch_model.bin, tokenizer.json; never the network) and writes a workdir as training does:
config.json and provenance.json (reporting.Reporter), an orbax checkpoint of step 0 holding a fresh
train state with the converted parameters (checkpoints.Checkpointer), the tokenizer
(`tokenizers/target`, kind 'hf') and `converted_from.json` (the source directory and its
config.json). `transformer.restore(OUT)`, `python -m transformer.predict --workdir=OUT` and
`train.py --init_from=OUT` (fine-tuning) read it; `eval.py` too when `--text_file` gave it data
(without, `data.dataset` is empty: the workdir holds a model and its tokenizer only).
`--to_hf` writes config.json, model.safetensors (and tokenizer.json for an 'hf' tokenizer) for any
run whose config maps onto GPT-2; a config that does not is a one-line error naming the key. (A
decoder-only seq2seq run, `model.prefix_lm`, exports as GPT-2 is: causal over the prompt too.)

GPT-2 in our knobs: decoder_only, pre-LN with a final LayerNorm (`norm_position='pre'`, LayerNorm
with bias, `norm_eps` = layer_norm_epsilon), learned positions (`positional='learned'`, `max_len` =
n_positions), biases everywhere (`use_bias`), tanh GELU (`ffn='gelu_tanh'`), unscaled embeddings
(`scale_embeddings=False`), tied head (`tie_embeddings`), attention scaled by 1/sqrt(head_dim) (ours
always is). GPT-2's fused Conv1D c_attn weight [d, 3d] (columns q | k | v, heads major) is exactly
our fused `qkv` kernel [d, 3, n, h] reshaped; Conv1D weights are [in, out] like our kernels.
Dropout: resid_pdrop -> model.dropout_rate (ours also drops the embeddings with it: embd_pdrop is
not kept separately), attn_pdrop -> attention_dropout_rate.

Token ids: our id = Hugging Face id + NUM_SPECIAL (4). Our code reserves ids 0-3 (pad, which is
also the decoder's start token; EOS; BOS; UNK: data/tokenizers.py) and treats id 0 as padding
(segment ids default to tokens != 0), while GPT-2's id 0 is "!". Shifting every id keeps GPT-2's
whole vocabulary intact and ours unchanged, and makes the round trip trivial: the four rows
inserted at the top of the embedding table (and of an untied head) are dropped again on export,
so HF -> ours -> HF is bitwise equal. The inserted rows are copies of GPT-2's <|endoftext|> row
(eos_token_id; the mean row when the config has none in range), because that is what each
special means to GPT-2: the start token 0 then reads as the <|endoftext|> GPT-2 saw before every
document, and predicting our EOS is predicting <|endoftext|>: greedy decoding (argmax takes the
lowest of equal ids) stops exactly where Hugging Face's generate stops. Logits on the GPT-2 ids
are GPT-2's; the cost is that the softmax counts <|endoftext|>'s logit four times in decoding
(EOS, BOS, UNK and itself; decoding never emits the pad) and five times in the loss, until
fine-tuning separates them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from absl import logging
import jax
import numpy as np

from transformer import checkpoints, defaults, files, optim, reporting, steps
from transformer.config import Config, ConfigError, ModelConfig, from_configdict, to_dict
from transformer.data import tokenizers
from transformer.data.tokenizers import NUM_SPECIAL, HFTokenizer, read_hf_tokenizer
from transformer.models import build_model

CONVERTED_FROM = "converted_from.json"
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                "relu": "relu"}
_HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


class ConvertError(ValueError):
  """A checkpoint or config that cannot be converted; the message is one line naming the key."""


# ----------------------------------------------------------------------------- configs


def model_overrides(hf: dict[str, Any]) -> dict[str, Any]:
  """Our model config keys for a GPT-2 config.json dict; ConvertError names an unmappable key."""
  if hf.get("model_type") != "gpt2":
    raise ConvertError(f"config.json: model_type={hf.get('model_type')!r} is not supported "
                       f"(only 'gpt2')")
  checks = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
            "add_cross_attention": False}
  for key, want in checks.items():
    if hf.get(key, want) != want:
      raise ConvertError(f"config.json: {key}={hf[key]!r} has no counterpart here (need {want})")
  for key in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
    if not isinstance(hf.get(key), int) or hf[key] <= 0:
      raise ConvertError(f"config.json: {key}={hf.get(key)!r} must be a positive integer")
  act = hf.get("activation_function", "gelu_new")
  if act not in _ACTIVATIONS:
    raise ConvertError(f"config.json: activation_function={act!r} is not one of "
                       f"{'|'.join(_ACTIVATIONS)}")
  d, heads = hf["n_embd"], hf["n_head"]
  return dict(
      arch="decoder_only", vocab_size=hf["vocab_size"] + NUM_SPECIAL,
      source_vocab_size=hf["vocab_size"] + NUM_SPECIAL,  # as training fills it in for an LM
      d_model=d, num_heads=heads, num_kv_heads=0, head_dim=0, v_head_dim=0,
      mlp_dim=hf.get("n_inner") or 4 * d, num_encoder_layers=0, num_decoder_layers=hf["n_layer"],
      positional="learned", norm="layernorm", norm_position="pre",
      norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), ffn=_ACTIVATIONS[act], use_bias=True,
      dropout_rate=float(hf.get("resid_pdrop", 0.1)),
      attention_dropout_rate=float(hf.get("attn_pdrop", 0.1)), ffn_dropout_rate=0.0,
      tie_embeddings=bool(hf.get("tie_word_embeddings", True)), share_src_tgt_embeddings=True,
      scale_embeddings=False, prefix_lm=False, scan_layers=False, dtype="float32",
      param_dtype="float32", max_len=hf["n_positions"])


def hf_config(m: ModelConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
  """The GPT-2 config.json dict of model config `m`; ConvertError names the first key GPT-2 lacks.

  `extra` (the source's config.json, for a converted run) gives the keys with no counterpart in
  ours (token ids, initializer range, ...); architecture keys always come from `m`.
  """
  need = {"arch": "decoder_only", "positional": "learned", "norm": "layernorm",
          "norm_position": "pre", "use_bias": True, "scale_embeddings": False,
          "num_kv_heads": m.num_heads, "head_dim": m.d_model // m.num_heads,
          "v_head_dim": m.d_model // m.num_heads, "ffn_dropout_rate": 0.0}
  for key, want in need.items():
    if getattr(m, key) != want:
      raise ConvertError(f"model.{key}={getattr(m, key)!r} has no GPT-2 counterpart "
                         f"(need {want!r})")
  if m.ffn not in _HF_ACTIVATION:
    raise ConvertError(f"model.ffn={m.ffn!r} has no GPT-2 counterpart (one of "
                       f"{'|'.join(_HF_ACTIVATION)})")
  if m.vocab_size <= NUM_SPECIAL:
    raise ConvertError(f"model.vocab_size={m.vocab_size} leaves no Hugging Face ids "
                       f"(ids below {NUM_SPECIAL} are ours)")
  out = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "bos_token_id": None,
         "eos_token_id": None} | dict(extra or {})
  activation = out.get("activation_function")  # the source's name when it means the same
  if _ACTIVATIONS.get(activation) != m.ffn:
    activation = _HF_ACTIVATION[m.ffn]
  inner = None if out.get("n_inner") is None and m.mlp_dim == 4 * m.d_model else m.mlp_dim
  out |= {"vocab_size": m.vocab_size - NUM_SPECIAL, "n_positions": m.max_len, "n_embd": m.d_model,
          "n_layer": m.num_decoder_layers, "n_head": m.num_heads, "n_inner": inner,
          "activation_function": activation,
          "layer_norm_epsilon": m.norm_eps, "resid_pdrop": m.dropout_rate,
          "embd_pdrop": m.dropout_rate, "attn_pdrop": m.attention_dropout_rate,
          "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
          "add_cross_attention": False, "tie_word_embeddings": m.tie_embeddings}
  return out


def workdir_config(hf: dict[str, Any], hf_tokenizer: str, text_file: str = "",
                   data_dir: str = "") -> Config:
  """The full config of a converted GPT-2: base.py's defaults, GPT-2's model, an 'hf' tokenizer,
  an LM over `text_file` (none if empty; prepared in `data_dir`) and greedy decoding."""
  cd = defaults.get_config()
  m = model_overrides(hf)
  cd.model.update(m)
  length = m["max_len"]
  cd.data.update(dataset="text_files" if text_file else "", text_file=text_file, data_dir=data_dir,
                 tokenizer="hf", source_tokenizer="", hf_tokenizer=hf_tokenizer,
                 max_source_len=length, max_target_len=length, batch_size=8, batching="pack")
  cd.train.update(optimizer="adamw", schedule="constant", learning_rate=1e-4, warmup_steps=0,
                  label_smoothing=0.0, grad_clip=1.0, b2=0.99, eps=1e-8)
  cd.eval.update(metrics="bpc", num_batches=20, num_decode_examples=0)
  cd.eval.decode.update(method="greedy", max_decode_len=min(64, length // 2))
  cd.checkpoint.update(keep_best_by="")
  return from_configdict(cd)


# ----------------------------------------------------------------------------- weights


def _layers(decoder: dict[str, Any], num_layers: int) -> list[dict[str, Any]]:
  """Per-layer parameter dicts, whether the layers are unrolled (layers_i) or scanned (layers)."""
  if "layers" in decoder:  # scan_layers: every leaf stacked on axis 0
    return [jax.tree.map(lambda x, i=i: np.asarray(x)[i], decoder["layers"])
            for i in range(num_layers)]
  return [decoder[f"layers_{i}"] for i in range(num_layers)]


def _special_rows(table: np.ndarray, eos_id: Any) -> np.ndarray:
  """The NUM_SPECIAL rows inserted above GPT-2's ids: its <|endoftext|> row (see the docstring)."""
  if isinstance(eos_id, int) and 0 <= eos_id < table.shape[0]:
    row = table[eos_id]
  else:
    row = table.mean(axis=0)
  return np.repeat(row[None].astype(table.dtype), NUM_SPECIAL, axis=0)


def params_from_hf(state: dict[str, np.ndarray], m: ModelConfig, eos_id: Any) -> dict[str, Any]:
  """Our DecoderOnly parameters (unrolled layers) from a GPT-2 state dict (`transformer.` prefix
  removed); every array is a reshaped, never recomputed, copy."""
  n, h, d = m.num_heads, m.d_model // m.num_heads, m.d_model
  wte = state["wte.weight"]
  norm = lambda p: {"scale": state[f"{p}.weight"], "bias": state[f"{p}.bias"]}  # noqa: E731
  decoder: dict[str, Any] = {
      "position_embed": {"embedding": state["wpe.weight"]},
      "final_norm": norm("ln_f")}
  for i in range(m.num_decoder_layers):
    p = f"h.{i}"
    decoder[f"layers_{i}"] = {
        "attention_norm": norm(f"{p}.ln_1"),
        "self_attention": {
            "qkv": {"kernel": state[f"{p}.attn.c_attn.weight"].reshape(d, 3, n, h),
                    "bias": state[f"{p}.attn.c_attn.bias"].reshape(3, n, h)},
            "out": {"kernel": state[f"{p}.attn.c_proj.weight"].reshape(n, h, d),
                    "bias": state[f"{p}.attn.c_proj.bias"]}},
        "ffn_norm": norm(f"{p}.ln_2"),
        "ffn": {"wi": {"kernel": state[f"{p}.mlp.c_fc.weight"],
                       "bias": state[f"{p}.mlp.c_fc.bias"]},
                "wo": {"kernel": state[f"{p}.mlp.c_proj.weight"],
                       "bias": state[f"{p}.mlp.c_proj.bias"]}}}
  if not m.tie_embeddings:
    head = state["lm_head.weight"]  # [vocab, d]
    decoder["logits_dense"] = {"kernel": np.concatenate([_special_rows(head, eos_id), head]).T}
  return {"token_embed": {"embedding": np.concatenate([_special_rows(wte, eos_id), wte])},
          "decoder": decoder}


def hf_from_params(params: Any, m: ModelConfig) -> dict[str, np.ndarray]:
  """The GPT2LMHeadModel state dict (float32 numpy, `transformer.` prefixed) of our parameters."""
  d = m.d_model
  dec = params["decoder"]
  out = {"transformer.wte.weight": params["token_embed"]["embedding"][NUM_SPECIAL:],
         "transformer.wpe.weight": dec["position_embed"]["embedding"]}

  def norm(name, p):
    out[f"transformer.{name}.weight"], out[f"transformer.{name}.bias"] = p["scale"], p["bias"]

  for i, layer in enumerate(_layers(dec, m.num_decoder_layers)):
    p = f"transformer.h.{i}"
    att, ffn = layer["self_attention"], layer["ffn"]
    norm(f"h.{i}.ln_1", layer["attention_norm"])
    norm(f"h.{i}.ln_2", layer["ffn_norm"])
    out[f"{p}.attn.c_attn.weight"] = np.reshape(att["qkv"]["kernel"], (d, 3 * d))
    out[f"{p}.attn.c_attn.bias"] = np.reshape(att["qkv"]["bias"], (3 * d,))
    out[f"{p}.attn.c_proj.weight"] = np.reshape(att["out"]["kernel"], (d, d))
    out[f"{p}.attn.c_proj.bias"] = att["out"]["bias"]
    out[f"{p}.mlp.c_fc.weight"], out[f"{p}.mlp.c_fc.bias"] = ffn["wi"]["kernel"], ffn["wi"]["bias"]
    out[f"{p}.mlp.c_proj.weight"] = ffn["wo"]["kernel"]
    out[f"{p}.mlp.c_proj.bias"] = ffn["wo"]["bias"]
  norm("ln_f", dec["final_norm"])
  if not m.tie_embeddings:
    out["lm_head.weight"] = np.asarray(dec["logits_dense"]["kernel"]).T[NUM_SPECIAL:]
  return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in out.items()}


# ----------------------------------------------------------------------------- Hugging Face dirs


def read_hf(directory: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(config.json dict, state dict without the `transformer.` prefix) of a local HF directory."""
  path = os.path.join(directory, "config.json")
  if not files.exists(path):
    raise ConvertError(f"--from_hf={directory}: no config.json (a Hugging Face model directory?)")
  hf = json.loads(files.read_text(path))
  model_overrides(hf)  # an unsupported config is reported before any weight is read
  weights = os.path.join(directory, "model.safetensors")
  if files.exists(weights):
    from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top  (optional)
    state = load_file(weights)
  elif files.exists(os.path.join(directory, "pytorch_model.bin")):
    import torch  # pylint: disable=g-import-not-at-top  (optional, heavy)
    loaded = torch.load(os.path.join(directory, "pytorch_model.bin"), map_location="cpu",
                        weights_only=True)
    state = {k: v.float().numpy() for k, v in loaded.items()}
  else:
    raise ConvertError(f"--from_hf={directory}: no model.safetensors or pytorch_model.bin")
  state = {k.removeprefix("transformer."): np.asarray(v, np.float32) for k, v in state.items()}
  return hf, state


def write_hf(directory: str, hf: dict[str, Any], state: dict[str, np.ndarray],
             tokenizer: Any = None) -> None:
  """Writes config.json, model.safetensors (a tied head is left out, as Hugging Face does) and,
  for an 'hf' tokenizer, its tokenizer.json."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top  (optional)
  files.makedirs(directory)
  files.write_text_atomic(os.path.join(directory, "config.json"),
                          json.dumps(hf, indent=2, sort_keys=True))
  save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
  if isinstance(tokenizer, HFTokenizer):
    files.write_text_atomic(os.path.join(directory, "tokenizer.json"), tokenizer.tokenizer_json)


# ----------------------------------------------------------------------------- workdirs


def write_workdir(cfg: Config, params: Any, tokenizer: Any, workdir: str,
                  converted_from: dict[str, Any]) -> None:
  """A workdir as training writes one: config.json, provenance.json, checkpoint 0 (a fresh train
  state holding `params`), tokenizers/target and converted_from.json."""
  if any(files.exists(os.path.join(workdir, name)) for name in ("config.json", "checkpoints")):
    raise ConvertError(f"--workdir={workdir} already holds a run; give a new directory")
  model = build_model(cfg.model)
  example = {"targets": np.ones((1, 4), np.int32)}
  state = steps.create_train_state(cfg, model, jax.random.key(cfg.seed), example,
                                   optim.make_optimizer(cfg.train, d_model=cfg.model.d_model))
  want = jax.tree_util.tree_structure(state.params)
  if jax.tree_util.tree_structure(params) != want:
    raise ConvertError(f"converted parameters do not match the model {cfg.model.arch} builds")
  for (path, got), new in zip(jax.tree_util.tree_flatten_with_path(state.params)[0],
                              jax.tree.leaves(params)):
    if got.shape != np.shape(new):
      raise ConvertError(f"parameter {jax.tree_util.keystr(path)} has shape {np.shape(new)}, "
                         f"the config builds {got.shape}")
  state = state.replace(params=jax.tree.map(lambda x: jax.numpy.asarray(x, np.float32), params))
  config_dict = to_dict(cfg)
  reporting.Reporter(workdir, config_dict, show_progress=False).close()
  tokenizer.save(os.path.join(workdir, "tokenizers", "target"))
  files.write_text_atomic(os.path.join(workdir, CONVERTED_FROM),
                          json.dumps(converted_from, indent=2, sort_keys=True))
  ckpt = checkpoints.Checkpointer(workdir, cfg.checkpoint, config=config_dict)
  try:
    ckpt.save(0, state, force=True)
  finally:
    ckpt.close()


def from_hf(hf_dir: str, workdir: str, text_file: str = "", data_dir: str = "") -> Config:
  """Converts the GPT-2 in local directory `hf_dir` into `workdir`; returns the workdir's config.
  `text_file` (data.text_file, prepared in data.data_dir=`data_dir`) gives it data for eval.py."""
  hf, state = read_hf(hf_dir)
  tokenizer_path = os.path.join(hf_dir, "tokenizer.json")
  if not files.exists(tokenizer_path):
    raise ConvertError(f"--from_hf={hf_dir}: no tokenizer.json (write one with transformers' "
                       f"AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR))")
  if text_file:
    text_file = os.path.abspath(text_file)
  cfg = workdir_config(hf, os.path.abspath(tokenizer_path), text_file, data_dir)
  tokenizer = read_hf_tokenizer(tokenizer_path)
  if tokenizer.vocab_size > cfg.model.vocab_size:
    raise ConvertError(f"{tokenizer_path}: {tokenizer.vocab_size - NUM_SPECIAL} ids, more than "
                       f"config.json's vocab_size={hf['vocab_size']}")
  params = params_from_hf(state, cfg.model, hf.get("eos_token_id"))
  write_workdir(cfg, params, tokenizer, workdir,
                {"from_hf": os.path.abspath(hf_dir), "config": hf})
  return cfg


def to_hf(workdir: str, hf_dir: str, step: int | str | None = None) -> dict[str, Any]:
  """Writes the run in `workdir` (checkpoint `step`) as a GPT-2 directory; returns its config."""
  cfg = checkpoints.load_run_config(workdir)
  source = os.path.join(workdir, CONVERTED_FROM)
  extra = json.loads(files.read_text(source))["config"] if files.exists(source) else None
  hf = hf_config(cfg.model, extra)
  params, _ = checkpoints.restore_params(cfg, workdir, step)
  tok_dir = os.path.join(workdir, "tokenizers", "target")
  tokenizer = tokenizers.load(tok_dir) if files.exists(os.path.join(tok_dir, "tokenizer.json")) \
      else None
  state = hf_from_params(params, cfg.model)
  write_hf(hf_dir, hf, state, tokenizer)
  return hf


# ----------------------------------------------------------------------------- command line


class _Parser(argparse.ArgumentParser):
  def error(self, message):
    print(f"error: {message} (see --help)", file=sys.stderr)
    sys.exit(2)


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the command line; returns the exit status (errors are one line on stderr)."""
  parser = _Parser(prog="python -m transformer.convert",
                   description="Hugging Face GPT-2 <-> workdir.")
  parser.add_argument("--workdir", required=True, help="the workdir written or read")
  parser.add_argument("--from_hf", default="", help="a local Hugging Face GPT-2 directory to read")
  parser.add_argument("--to_hf", default="", help="a directory to write a Hugging Face GPT-2 to")
  parser.add_argument("--text_file", default="",
                      help="--from_hf: data for eval.py (data.text_file)")
  parser.add_argument("--data_dir", default="", help="--from_hf: where that data is prepared "
                      "(data.data_dir; default: the usual TFDS directory)")
  parser.add_argument("--step", default="latest", help="--to_hf: an integer, 'latest' or 'best'")
  args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
  if bool(args.from_hf) == bool(args.to_hf):
    parser.error("give exactly one of --from_hf and --to_hf")
  verbosity = logging.get_verbosity()  # restored below: in-process callers keep their logging
  logging.set_verbosity(logging.ERROR)  # orbax and TFDS are chatty; stderr is for our one line
  try:
    if args.from_hf:
      cfg = from_hf(args.from_hf, args.workdir, args.text_file, args.data_dir)
      print(f"wrote {args.workdir}: GPT-2 with {cfg.model.num_decoder_layers} layers, d_model "
            f"{cfg.model.d_model}, vocabulary {cfg.model.vocab_size} ({NUM_SPECIAL} ours + "
            f"{cfg.model.vocab_size - NUM_SPECIAL})")
    else:
      step = int(args.step) if args.step.lstrip("-").isdigit() else args.step
      hf = to_hf(args.workdir, args.to_hf, step)
      print(f"wrote {args.to_hf}: GPT-2 with {hf['n_layer']} layers, vocabulary {hf['vocab_size']}")
  except (ConvertError, ConfigError, ValueError, FileNotFoundError) as e:
    print(f"error: {(str(e).splitlines() or [type(e).__name__])[0]}", file=sys.stderr)
    return 1
  finally:
    logging.set_verbosity(verbosity)
  return 0


if __name__ == "__main__":
  sys.exit(main())
