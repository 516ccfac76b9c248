"""Fine-tuning's start (`train.py --init_from=RUN`): the config and parameters of a run that starts
from another run's workdir. Decoder-only and encoder-decoder configs take its whole model,
tokenizers and parameters; encoder-only ones its encoder, embeddings and input tokenizer, with a
fresh head of the config's `head`/`vocab_head` keys (head mlm on an encoder-only mlm run continues
the run's). Keys of role `run_tokenizer` come from the run, model keys of role `finetune` not.
"""

import dataclasses
from typing import Any

import jax

from transformer import config as config_lib, keyspec, schema
from transformer.config import Config
from transformer.run import restore

HEAD = "head"  # the parameter subtree of an encoder-only model's head
SHARED = ("token_embed", "encoder")  # what an encoder-only model takes from any pretrained run


def continues_head(run: Config, head: str) -> bool:
  """True when an encoder-only model with `head` continues the run's own masked-LM head."""
  return run.model.arch == "encoder_only" and run.model.head == "mlm" and head == "mlm"


def _run_config(init_from: str) -> Config:
  try:
    return restore.load_run_config(init_from)
  except restore.EvaluationError as e:
    raise config_lib.ConfigError(f"--init_from={init_from}: {e}") from None


def init_from_config(cfg: Config, init_from: str) -> Config:
  """`cfg` with the model and tokenizer keys of the run in `init_from` (see the module doc)."""
  run = _run_config(init_from)
  keep = schema.with_role(keyspec.FINETUNE, "model")
  data = dataclasses.replace(cfg.data, **{
      k: getattr(run.data, k) for k in schema.with_role(keyspec.RUN_TOKENIZER, "data")})
  if cfg.model.arch == "encoder_only":  # the pretrained encoder and its input tokenizer only
    if run.model.arch == "decoder_only":
      raise config_lib.ConfigError(f"--init_from={init_from}: a decoder_only run has no encoder "
                                   f"for model.arch='encoder_only'")
    keep += schema.with_role(keyspec.HEAD, "model")
    if not continues_head(run, cfg.model.head):
      keep += schema.with_role(keyspec.VOCAB_HEAD, "model")
    source = run.data.source_tokenizer or run.data.tokenizer
    # An objective (masked LM) predicts the input's own ids: the run's tokenizer on both sides.
    target = source if cfg.data.objective != "none" else cfg.data.tokenizer
    data = dataclasses.replace(data, tokenizer=target, source_tokenizer=source)
  model = dataclasses.replace(run.model, **{k: getattr(cfg.model, k) for k in keep})
  if run.model.arch == "encoder_decoder" and cfg.model.arch == "encoder_only":
    model = dataclasses.replace(model, vocab_size=run.model.source_vocab_size)
  merged = dataclasses.replace(cfg, model=model, data=data)
  try:
    return config_lib.from_configdict(dataclasses.asdict(merged))  # e.g. lengths vs max_len
  except config_lib.ConfigError as e:
    raise config_lib.ConfigError(f"--init_from={init_from}: {e}") from None


def init_params(init_from: str, fresh: Any = None, head: str = "") -> Any:
  """The latest parameters (or EMA) of the run in `init_from`; with an encoder-only model's
  `fresh` parameters and `head`, shared_params of the two."""
  run = _run_config(init_from)
  try:
    params = restore.restore_params(run, init_from)[0]
  except restore.StepFailsVerification as e:  # train.py has no --step: other advice
    other = (f"--init_from reads the newest step: `mv {e.where} {e.where}.corrupt` to start "
             f"from step {e.verified}, the newest that verifies" if e.verified is not None
             else "no other step of that run verifies")
    raise config_lib.ConfigError(f"--init_from={init_from}: its newest checkpoint {e.where} "
                                 f"fails verification ({e.reason}); {other}") from None
  except restore.EvaluationError as e:
    raise config_lib.ConfigError(f"--init_from={init_from}: {e}") from None
  if fresh is None:
    return params
  return shared_params(params, fresh, init_from, keep_head=continues_head(run, head))


def _leaves(tree: Any) -> dict[str, Any]:
  return {"/".join(str(getattr(k, "key", k)) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def shared_params(pretrained: Any, fresh: Any, init_from: str, keep_head: bool = False) -> Any:
  """`fresh` with every parameter outside its HEAD subtree (inside too if `keep_head`) taken from
  `pretrained`; a mismatch in names or shapes is a ConfigError naming them."""
  source = dict(pretrained)
  if "token_embed" not in source:  # an encoder-decoder run with separate tables
    source["token_embed"] = source.get("source_embed", {})
  taken = SHARED + ((HEAD,) if keep_head else ())
  leaves = _leaves(fresh)
  want = {k: v for k, v in leaves.items() if keep_head or not k.startswith(HEAD + "/")}
  have = _leaves({k: v for k, v in source.items() if k in taken})
  missing = sorted(set(want) - set(have))
  unexpected = sorted(set(have) - set(want))
  shapes = sorted(k for k in set(want) & set(have) if want[k].shape != have[k].shape)
  if missing or unexpected or shapes:
    parts = [f"{name}: {', '.join(keys[:6])}{' ...' if len(keys) > 6 else ''}" for name, keys in
             (("missing in the run", missing), ("not in the new model", unexpected),
              ("shapes differ", shapes)) if keys]
    what = "model's" if keep_head else "encoder's"
    raise config_lib.ConfigError(f"--init_from={init_from}: the {what} parameters do not "
                                 f"match ({'; '.join(parts)})")
  return jax.tree_util.tree_unflatten(jax.tree.structure(fresh), [
      have[n].astype(leaf.dtype) if n in have else leaf for n, leaf in leaves.items()])
