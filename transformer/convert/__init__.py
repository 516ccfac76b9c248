"""Hugging Face checkpoints <-> workdirs, with identical probabilities: GPT-2, T5, BERT, the
Llama family (Llama 2 and 3, Mistral, Qwen2), Mixtral and ViT.

  python -m transformer.convert --from_hf=DIR --workdir=OUT [--text_file=CORPUS [--data_dir=D]]
  python -m transformer.convert --workdir=OUT --to_hf=DIR [--step=latest] [--overwrite]

`--from_hf` reads a local directory (config.json, model.safetensors or pytorch_model.bin,
tokenizer.json, which a ViT has not: its labels are config.json's id2label; never the network)
into a workdir training could have written, plus
`converted_from.json`; config.json's model_type picks the family (`FAMILIES`: each module's
declared `Family`, family.py), whose checks (checks.py: format, every tensor's shape, none missing
or left over, finite values, special-token ids against the vocabulary and tokenizer.json's special
tokens) run before anything is written. Our ids in
no Hugging Face id's place are `model.excluded_ids` (logit -1e30), so every consumer of the
logits sees the original's distribution, id for id. `--to_hf` refuses a directory that is not
empty unless `--overwrite` is given; then it replaces only the files it writes (each written whole
beside its target first, so a failed export leaves the old files as they were) and removes none.
`--from_hf` refuses a workdir that holds a run.
"""

import contextlib
import json
import os
import sys
from types import ModuleType
from typing import Any, Sequence

from absl import flags
from absl import logging
import jax
import numpy as np

from transformer import cli, files
from transformer.config import Config, ConfigError, ModelConfig, to_dict
from transformer.convert import agreement, bert, checks, gpt2, llama, mixtral, t5, vit
from transformer.convert.common import first_id
from transformer.convert.family import ConvertError, Family
from transformer.data import tokenizers
from transformer.model import parametrization
from transformer.model.models import build_model, example_batch
from transformer.run import checkpoints, guard, provenance, reporting, restore
from transformer.train import optim, steps

__all__ = ["ConvertError", "Family", "FAMILIES", "from_hf", "to_hf", "read_hf", "write_hf",
           "check_export_dir", "main"]

CONVERTED_FROM = provenance.CONVERTED_FROM
# Every family; a new one is a module ending in its Family, listed here.
FAMILIES: tuple[Family, ...] = (gpt2.FAMILY, t5.FAMILY, bert.FAMILY, llama.FAMILY,
                                mixtral.FAMILY, vit.FAMILY)


def family_of_hf(hf: dict[str, Any]) -> Family:
  """The family of a config.json dict; ConvertError names an unsupported model_type."""
  for family in FAMILIES:
    if family.reads(hf):
      return family
  kinds = [kind for family in FAMILIES for kind in family.model_types]
  raise ConvertError(f"config.json: model_type={hf.get('model_type')!r} is not supported "
                     f"(one of {'|'.join(kinds)})")


def export_family(m: ModelConfig) -> Family:
  """The family model config `m` exports as (the families of one architecture are disjoint)."""
  found = [family for family in FAMILIES if family.exports_model(m)]
  if len(found) != 1:
    raise ConvertError(f"model.arch={m.arch!r} has {len(found)} Hugging Face families to export "
                       f"as ({', '.join(f.name for f in found) or 'none'}); it needs one")
  return found[0]


def family_of_config(m: ModelConfig) -> ModuleType:
  """The module declaring the family `m` exports as (its docstring maps every key)."""
  return sys.modules[export_family(m).module]


def read_hf(directory: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(config.json dict, state dict as float32 numpy) of a local Hugging Face directory."""
  path = os.path.join(directory, "config.json")
  if not files.exists(path):
    raise ConvertError(f"--from_hf={directory}: no config.json (a Hugging Face model directory?)")
  hf = _json_object(path)
  if "model_type" not in hf and isinstance(hf.get("model"), dict):  # our workdir's config.json
    raise ConvertError(f"--from_hf={directory} is a run's workdir, not a Hugging Face directory "
                       f"(export it: --workdir={directory} --to_hf=DIR)")
  family_of_hf(hf).model_overrides(hf, None)  # an unsupported config is reported before any weight
  weights = checks.weights_file(directory)
  try:
    if weights.endswith(".safetensors"):
      from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top  (optional)
      state = load_file(weights)
    else:
      import torch  # pylint: disable=g-import-not-at-top  (optional, heavy)
      loaded = torch.load(weights, map_location="cpu", weights_only=True)
      state = {k: v.float().numpy() for k, v in loaded.items()}
  except Exception as e:  # pylint: disable=broad-except  (each reader has its own error types)
    if cli.environment_error(e) is not None:  # a failure of the machine: reported as such
      raise
    why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    raise ConvertError(f"{weights}: not a readable weights file ({type(e).__name__}: {why}); "
                       "is it complete?") from e
  return hf, {k: np.asarray(v, np.float32) for k, v in state.items()}


def _json_object(path: str) -> dict[str, Any]:
  """The JSON object in file `path`; ConvertError naming the file when it holds none."""
  try:
    value = json.loads(files.read_text(path))
  except UnicodeDecodeError:
    raise ConvertError(f"{path}: not UTF-8 text (a JSON file?)") from None
  except json.JSONDecodeError as e:
    raise ConvertError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
  if not isinstance(value, dict):
    raise ConvertError(f"{path}: holds a JSON {type(value).__name__}, not an object of keys")
  return value


def check_export_dir(directory: str, overwrite: bool = False) -> None:
  """Raises ConvertError when `directory` is a file, a run's workdir or inside one (the write
  guard), or holds files and `overwrite` is False."""
  if files.exists(directory) and not files.isdir(directory):
    raise ConvertError(f"--to_hf={directory} is a file, not a directory")
  try:  # any run's workdir, or a folder inside one, belongs to that run, --overwrite or not
    guard.check(directory, "--to_hf", overwrite=True)
  except guard.WriteRefused as e:
    raise ConvertError(str(e)) from None
  held = files.listdir(directory) if files.exists(directory) else []
  if held and not overwrite:
    shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
    raise ConvertError(f"--to_hf={directory} is not empty ({shown}); give an empty or new "
                       "directory, or --overwrite to replace the files the export writes")


def hf_tokenizer_config(hf: dict[str, Any], tokenizer: tokenizers.HFTokenizer) -> dict[str, Any]:
  """tokenizer_config.json of an export: the special tokens that config.json's ids and the
  tokenizer's model name (AutoTokenizer then knows BOS, EOS, pad and unk), BERT's [CLS] [SEP]
  [MASK] where it has them, and the model's length."""
  out: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
  for key in ("bos", "eos", "pad"):
    hf_id = first_id(hf.get(f"{key}_token_id"))
    if hf_id is not None and tokenizer.token(hf_id) is not None:
      out[f"{key}_token"] = tokenizer.token(hf_id)
  named = {"unk": tokenizer.unk_token, "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
  out |= {f"{key}_token": token for key, token in named.items()
          if token and tokenizer.token_id(token) is not None}
  length = hf.get("max_position_embeddings") or hf.get("n_positions")
  return out | ({"model_max_length": length} if length else {})


def write_hf(directory: str, hf: dict[str, Any], state: dict[str, np.ndarray],
             tokenizer: Any = None, overwrite: bool = False) -> None:
  """Writes config.json, model.safetensors and, for an 'hf' tokenizer, its tokenizer.json into
  `directory` (a non-empty one only with `overwrite`; see the module doc)."""
  from safetensors.numpy import save  # pylint: disable=g-import-not-at-top  (optional)
  check_export_dir(directory, overwrite)
  written = {"model.safetensors": save(state, metadata={"format": "pt"}),
             "config.json": json.dumps(hf, indent=2, sort_keys=True).encode("utf-8")}
  if isinstance(tokenizer, tokenizers.HFTokenizer):
    written["tokenizer.json"] = tokenizer.tokenizer_json.encode("utf-8")
    written["tokenizer_config.json"] = json.dumps(
        hf_tokenizer_config(hf, tokenizer), indent=2, sort_keys=True).encode("utf-8")
  files.makedirs(directory)
  if not files.is_local(directory):  # an object upload is whole by itself; a bucket cannot rename
    for name, data in written.items():
      files.write_bytes_atomic(os.path.join(directory, name), data)
    return
  # Every file whole beside its target before any target is replaced: a failure (a full disk)
  # leaves the directory's files as they were, never a new config.json beside old weights.
  temps = {name: os.path.join(directory, f".{name}.tmp{os.getpid()}") for name in written}
  try:
    for name, data in written.items():
      files.write_bytes_atomic(temps[name], data)
    for name in written:
      os.replace(temps[name], os.path.join(directory, name))
  finally:
    for temp in temps.values():
      if files.exists(temp):
        files.remove(temp)


def write_workdir(cfg: Config, params: Any, tokenizer: Any, workdir: str,
                  converted_from: dict[str, Any] | None = None) -> None:
  """A workdir as training writes one, with `params` in checkpoint 0's fresh train state, and
  `converted_from` ({"from_hf": dir, "config": its config.json}) in converted_from.json."""
  _check_new_workdir(workdir)
  model = build_model(cfg.model)
  tx = optim.make_optimizer(cfg.train, cfg.model)
  key = jax.random.key(cfg.seed)
  # The state training would start from, as shapes only (a random init would compile for nothing).
  fresh = jax.eval_shape(lambda: steps.create_train_state(cfg, model, key,
                                                          example_batch(cfg.model, 4), tx))
  if jax.tree_util.tree_structure(params) != jax.tree_util.tree_structure(fresh.params):
    raise ConvertError(f"converted parameters do not match the model {cfg.model.arch} builds")
  for (path, got), new in zip(jax.tree_util.tree_flatten_with_path(fresh.params)[0],
                              jax.tree.leaves(params)):
    if got.shape != np.shape(new):
      raise ConvertError(f"parameter {jax.tree_util.keystr(path)} has shape {np.shape(new)}, "
                         f"the config builds {got.shape}")
  params = jax.tree.map(lambda x: jax.numpy.asarray(x, np.float32), params)
  state = steps.TrainState(step=jax.numpy.zeros((), jax.numpy.int32), params=params,
                           opt_state=jax.jit(tx.init)(params), rng=steps.key_data(key))
  if jax.tree_util.tree_structure(state) != jax.tree_util.tree_structure(fresh):
    raise ConvertError("the converted train state does not match the one training creates")
  config_dict = to_dict(cfg)
  reporting.Reporter(workdir, config_dict, show_progress=False).close()
  for side in ("target", "source") if cfg.model.arch == "encoder_decoder" else ("target",):
    tokenizer.save(os.path.join(workdir, "tokenizers", side))
  if converted_from is not None:
    files.write_text_atomic(os.path.join(workdir, CONVERTED_FROM),
                            json.dumps(converted_from, indent=2, sort_keys=True))
  ckpt = checkpoints.Checkpointer(workdir, cfg.checkpoint, config=config_dict)
  with contextlib.closing(ckpt):
    ckpt.save(0, state, force=True)


def _check_new_workdir(workdir: str) -> None:
  """Raises ConvertError when `workdir` is a file, holds a run or a config.json (a conversion
  never replaces one), or lies inside a run's workdir (the write guard)."""
  if files.exists(workdir) and not files.isdir(workdir):
    raise ConvertError(f"--workdir={workdir} is a file, not a directory")
  held = [n for n in ("config.json", "checkpoints") if files.exists(os.path.join(workdir, n))]
  if held:
    what = "a run" if guard.enclosing_run(workdir) is not None else held[0]
    raise ConvertError(f"--workdir={workdir} already holds {what}; give a new directory")
  try:  # a folder inside another run's workdir belongs to that run
    guard.check(workdir, "--workdir", overwrite=True)
  except guard.WriteRefused as e:
    raise ConvertError(str(e)) from None


def from_hf(hf_dir: str, workdir: str, text_file: str = "", data_dir: str = "") -> Config:
  """Converts `hf_dir` into `workdir`, with `text_file`'s data if given; returns its config."""
  _check_new_workdir(workdir)
  hf, state = read_hf(hf_dir)
  family = family_of_hf(hf)
  source = {"from_hf": os.path.abspath(hf_dir), "config": hf}
  if family.label_tokenizer is not None:  # an image classifier: labels, no text tokenizer
    cfg = family.workdir_config(hf, state, "", text_file, data_dir)
    write_workdir(cfg, family.params_from_hf(state, cfg.model, hf), family.label_tokenizer(hf),
                  workdir, source)
    return cfg
  tokenizer_path = os.path.join(hf_dir, "tokenizer.json")
  if not files.exists(tokenizer_path):
    raise ConvertError(f"--from_hf={hf_dir}: no tokenizer.json (write one with transformers' "
                       f"AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR))")
  cfg = family.workdir_config(hf, state, os.path.abspath(tokenizer_path),
                              text_file and os.path.abspath(text_file), data_dir)
  tokenizer = tokenizers.read_hf_tokenizer(tokenizer_path, cfg.data.hf_id_offset)
  if tokenizer.vocab_size > cfg.model.vocab_size:
    raise ConvertError(f"{tokenizer_path}: {tokenizer.vocab_size - cfg.data.hf_id_offset} ids, "
                       f"more than config.json's vocab_size={hf['vocab_size']}")
  checks.check_special_ids(hf, min(tokenizer.vocab_size - cfg.data.hf_id_offset,
                                   hf["vocab_size"]))
  tokenizer_config = os.path.join(hf_dir, "tokenizer_config.json")
  checks.check_special_tokens(hf, tokenizer, _json_object(tokenizer_config)
                              if files.exists(tokenizer_config) else None)
  params = family.params_from_hf(state, cfg.model, hf, tokenizer)
  write_workdir(cfg, params, tokenizer, workdir, source)
  return cfg


def source_config(workdir: str, family: Family) -> dict[str, Any] | None:
  """The config.json a run descends from (converted_from.json, which fine-tuning with
  --init_from carries on), when it is `family`'s: it gives the keys ours lacks (BOS, names)."""
  path = os.path.join(workdir, CONVERTED_FROM)
  if not files.exists(path):
    return None
  hf = json.loads(files.read_text(path))["config"]
  return hf if family.reads(hf) else None


def to_hf(workdir: str, hf_dir: str, step: int | str | None = None,
          overwrite: bool = False) -> dict[str, Any]:
  """Writes checkpoint `step` of `workdir` as a Hugging Face directory (a non-empty one only with
  `overwrite`, never the run's own); returns its config.json."""
  if os.path.realpath(hf_dir) == os.path.realpath(workdir):
    raise ConvertError(f"--to_hf={hf_dir} is the run's own workdir; give another directory")
  check_export_dir(hf_dir, overwrite)
  cfg = restore.load_run_config(workdir)
  try:  # µP's multipliers are folded into the weights: the export is a standard model
    standard, _ = parametrization.to_standard(cfg.model, {})
  except ConfigError as e:
    raise ConvertError(str(e)) from None
  family = export_family(standard)
  hf = family.hf_config(standard, source_config(workdir, family))
  if family.hf_training is not None:  # config.json keys of the training objective
    hf |= family.hf_training(cfg.train, standard, hf)
  if cfg.data.tokenizer == "hf" and cfg.data.hf_id_offset != family.id_offset:
    raise ConvertError(f"data.hf_id_offset={cfg.data.hf_id_offset} has no {family.name} "
                       f"counterpart (need {family.id_offset})")
  params, _ = restore.restore_params(cfg, workdir, step)
  _, params = parametrization.to_standard(cfg.model, params)
  tok_dir = os.path.join(workdir, "tokenizers", "target")
  tokenizer = tokenizers.load(tok_dir) if files.exists(os.path.join(tok_dir, "tokenizer.json")) \
      else None
  if family.hf_tokenizer_keys is not None:  # config.json keys of the run's tokenizer
    hf |= family.hf_tokenizer_keys(tokenizer)
  write_hf(hf_dir, hf, family.hf_from_params(params, standard, hf), tokenizer, overwrite)
  return hf


def _define(f: flags.FlagValues) -> None:
  flags.DEFINE_string("workdir", None, "the workdir written or read", flag_values=f)
  flags.mark_flag_as_required("workdir", flag_values=f)
  flags.DEFINE_string("from_hf", "", "a local Hugging Face GPT-2, T5, BERT, Llama, Mistral, "
                      "Qwen2, Mixtral or ViT directory to read", flag_values=f)
  flags.DEFINE_string("to_hf", "", "a directory to write a Hugging Face model to (a decoder-only "
                      "run: Mixtral with RMSNorm and model.ffn=moe, Llama, Mistral or Qwen2 with "
                      "RMSNorm, else GPT-2; T5 for an encoder-decoder, BERT for an encoder-only "
                      "masked LM, ViT for an image classifier)", flag_values=f)
  flags.DEFINE_string("check", "", "a Hugging Face directory to score the workdir against (a "
                      "decoder-only one: its source or its export): the largest difference of "
                      "log-probabilities at each position", flag_values=f)
  flags.DEFINE_string("text_file", "", "--from_hf of a decoder-only model or BERT: data for "
                      "eval.py (data.text_file); --check: its first lines are the texts",
                      flag_values=f)
  flags.DEFINE_string("data_dir", "", "--from_hf: where that data is prepared (data.data_dir; "
                      "default: the usual TFDS directory)", flag_values=f)
  flags.DEFINE_string("step", "latest", "--to_hf: an integer, 'latest' or 'best'", flag_values=f)
  flags.DEFINE_bool("overwrite", False, "--to_hf into a directory that holds files: replace the "
                    "files the export writes (others are kept)", flag_values=f)


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the command line; returns the exit status (errors are one line on stderr)."""
  args, rest = cli.parse_own_flags("python -m transformer.convert", _define,
                                   sys.argv[1:] if argv is None else list(argv), __doc__)
  if rest or [bool(args.from_hf), bool(args.to_hf), bool(args.check)].count(True) != 1:
    print("error: give exactly one of --from_hf, --to_hf and --check, and no arguments (see "
          "--help)", file=sys.stderr)
    return 2
  verbosity = logging.get_verbosity()  # restored below: in-process callers keep their logging
  logging.set_verbosity(logging.ERROR)  # orbax and TFDS are chatty; stderr is for our one line
  try:
    if args.from_hf:
      cfg = from_hf(args.from_hf, args.workdir, args.text_file, args.data_dir)
      print(f"wrote {args.workdir}: {export_family(cfg.model).describe_workdir(cfg)}")
    elif args.check:
      texts = agreement.texts_of(args.text_file)
      diffs = agreement.position_differences(args.workdir, args.check, texts)
      print(agreement.report(args.workdir, args.check, diffs, len(texts)))
    else:
      step = int(args.step) if args.step.lstrip("-").isdigit() else args.step
      hf = to_hf(args.workdir, args.to_hf, step, overwrite=args.overwrite)
      print(f"wrote {args.to_hf}: {family_of_hf(hf).describe_hf(hf)}")
  except Exception as e:  # pylint: disable=broad-except  (cli.error_line decides)
    line = cli.error_line(e, (ConvertError, ConfigError, ValueError, OSError))
    if line is None:
      raise
    print(f"error: {line}", file=sys.stderr)
    return 1
  finally:
    logging.set_verbosity(verbosity)
  return 0
