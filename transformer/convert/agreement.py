"""`python -m transformer.convert --workdir=RUN --check=HF_DIR [--text_file=F]`: how far a
decoder-only workdir (GPT-2, Llama, Mistral, Qwen2, Mixtral) and a Hugging Face directory score
apart on the same text: at each position, the largest |log p(ours) - log p(Hugging Face)| over
the rows and the vocabulary (each Hugging Face id read at its place in ours). Either side may be
the source: a converted workdir against the checkpoint it came from, or an export against its
workdir. Ours reads its start token (id 0) where Hugging Face reads its BOS, as decoding does.
"""

import json
import os
from typing import Any, Sequence

import jax
import numpy as np

from transformer import files
from transformer.convert.common import first_id, shifted_ids
from transformer.convert.family import ConvertError
from transformer.data import tokenizers
from transformer.model.models import build_model
from transformer.run import restore

TEXTS = ("The meaning of life is", "Once upon a time, there was a little cat who",
         "Paris is the capital of France.")
MAX_TEXTS, MAX_TOKENS = 8, 64


def texts_of(text_file: str) -> list[str]:
  """The first MAX_TEXTS non-empty lines of `text_file`, or TEXTS without one."""
  if not text_file:
    return list(TEXTS)
  lines = [line.strip() for line in files.read_text(text_file).splitlines() if line.strip()]
  if not lines:
    raise ConvertError(f"--text_file={text_file}: no text")
  return lines[:MAX_TEXTS]


def _log_softmax(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _rows(workdir: str, hf: dict[str, Any], texts: Sequence[str]
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(our ids, Hugging Face's ids, mask), each [rows, 1 + longest]: start token / BOS first."""
  tok = tokenizers.load(f"{workdir}/tokenizers/target")
  places = shifted_ids(hf)
  back = {int(o): h for h, o in enumerate(places)}
  bos = first_id(hf.get("bos_token_id"))
  if bos is None:
    raise ConvertError("config.json: no bos_token_id to read where ours reads its start token")
  encoded = [[i for i in tok.encode(t) if i in back][:MAX_TOKENS] for t in texts]
  width = 1 + max(map(len, encoded))
  ours, theirs, mask = (np.zeros((len(texts), width), np.int64) for _ in range(3))
  for r, ids in enumerate(encoded):
    ours[r, 1:len(ids) + 1] = ids
    theirs[r, :len(ids) + 1] = [bos, *(back[i] for i in ids)]
    mask[r, :len(ids) + 1] = 1
  return ours, theirs, mask


def position_differences(workdir: str, hf_dir: str, texts: Sequence[str]) -> np.ndarray:
  """[positions]: the largest |log p(ours) - log p(HF)| at each position of `texts`."""
  import torch  # pylint: disable=g-import-not-at-top  (the [dev] extra: conversion only)
  import transformers  # pylint: disable=g-import-not-at-top
  path = os.path.join(hf_dir, "config.json")
  if not files.exists(path):
    raise ConvertError(f"--check={hf_dir}: no config.json (a Hugging Face model directory?)")
  hf = json.loads(files.read_text(path))
  cfg = restore.load_run_config(workdir)
  if cfg.model.arch != "decoder_only":
    raise ConvertError(f"--check compares decoder-only models (GPT-2, Llama, Mistral, Qwen2, "
                       f"Mixtral); {workdir} is {cfg.model.arch}")
  ours, theirs, mask = _rows(workdir, hf, texts)
  params, _ = restore.restore_params(cfg, workdir)
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  logits = build_model(cfg.model).apply({"params": params}, ours, positions,
                                        mask.astype(np.int32), method="decode")
  model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
  with torch.no_grad():
    want = model(input_ids=torch.tensor(theirs), attention_mask=torch.tensor(mask)).logits
  places = shifted_ids(hf)
  got = _log_softmax(jax.device_get(logits))[..., places]
  gap = np.abs(got - _log_softmax(want.float().numpy())).max(-1)  # [rows, positions]
  return np.where(mask.astype(bool), gap, 0.0).max(0)


def report(workdir: str, hf_dir: str, diffs: np.ndarray, texts: int) -> str:
  """The lines --check prints: one per position, then the largest."""
  lines = [f"{workdir} vs {hf_dir}, {texts} texts: largest |log p(ours) - log p(Hugging Face)| "
           "per position (nats)"]
  lines += [f"position {i:3d}: {d:.3g}" for i, d in enumerate(diffs)]
  worst = int(np.argmax(diffs))
  return "\n".join(lines + [f"largest: {diffs[worst]:.3g} at position {worst}"])
