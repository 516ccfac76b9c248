"""Tests of configs/*.py: every variant validates; the ablation partners and nanoGPT settings hold."""

import ast
import dataclasses
import functools
import glob
import importlib
import os
import re

import jax
import numpy as np
import pytest

from transformer.config import ConfigError, from_configdict
from transformer.data import builders, cmudict, load_task
from transformer.model.models import build_model
from transformer.train.start import fill_vocab_sizes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
G2P_VARIANTS = ["tiny", "fast", "best", "small", "base", "ablate"]
ALL = [f"{name}:{v}" for name in ("g2p", "g2p_decoder_only") for v in G2P_VARIANTS] + [
    "g2p:gpu", "lm:char", "lm:nanogpt_cpu", "lm:bpe", "lm:moe", "lm:moe_dense", "lm:isoflop",
    "wmt14_ende:", "lm1b:", "mlm:cmudict",
    "mlm:text", "classify:"]


def load(name):
  module, _, arg = name.partition(":")
  return importlib.import_module(f"configs.{module}").get_config(arg)


@pytest.mark.parametrize("name", ALL)
def test_every_config_validates(name):
  """Each config file and variant passes transformer.config validation (no typo'd keys)."""
  from_configdict(load(name))


def test_unknown_variant_is_a_clear_error():
  """An unknown variant names itself and the valid ones."""
  with pytest.raises(ValueError,
                     match="unknown variant 'huge'.*tiny, fast, best, small, base, ablate"):
    load("g2p:huge")


@functools.lru_cache(maxsize=None)
def cmudict_records():
  """CMUdict's no-stress splits as the records cmudict_g2p prepares, in memory."""
  return {split: [{"source": w, "target": p} for w, prons in words.items() for p in prons]
          for split, words in cmudict.load_splits(stress=False).items()}


_TASKS = {}  # what the vocabularies depend on -> Task; the variants share them


def with_training_vocab(cfg):
  """`cfg` with the vocabulary sizes training fills in: the real Task (its tokenizers built from
  CMUdict's training split, the decoder-only target ids placed after the source's) over
  cmudict_g2p's records, read from memory instead of a prepared directory (no ~15 s prepare)."""
  d = cfg.data
  key = (cfg.model.arch, d.dataset, d.tokenizer, d.source_tokenizer, d.train_split)
  if key not in _TASKS:
    records = cmudict_records()
    dataset = builders.Dataset(name="cmudict_g2p/no_stress", kind="seq2seq", source_key="source",
                               target_key="target", root=os.devnull + "/none",
                               splits=tuple(records), _open=records.__getitem__)
    with pytest.MonkeyPatch.context() as patch:
      patch.setattr(builders, "open_dataset", lambda _: dataset)
      _TASKS[key] = load_task(cfg, process_index=0, process_count=1)
  return fill_vocab_sizes(cfg, _TASKS[key])


def num_params(cfg):
  """Parameters of cfg.model, embeddings included, at the vocabulary sizes it carries."""
  model = build_model(cfg.model)
  ids = np.ones((1, 8), np.int32)
  args = (ids,) if cfg.model.arch == "decoder_only" else (ids, ids)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *args))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


def test_training_vocabularies_of_g2p():
  """The vocabulary sizes the parameter test uses are training's: 27 letters and 39 phones plus
  4 specials; the decoder-only table holds both (31 + 39 = 70 rows), as training sizes it."""
  enc_dec = with_training_vocab(from_configdict(load("g2p:tiny"))).model
  dec_only = with_training_vocab(from_configdict(load("g2p_decoder_only:tiny"))).model
  assert (enc_dec.source_vocab_size, enc_dec.vocab_size, dec_only.vocab_size) == (31, 43, 70)


@pytest.mark.parametrize("variant", G2P_VARIANTS)
def test_decoder_only_g2p_matches_encoder_decoder_parameters(variant):
  """g2p_decoder_only has the same parameter count as g2p (embeddings, norms and biases
  included) to within 1% at the vocabulary sizes training gives each (with_training_vocab), so
  the ablation compares architectures, not sizes."""
  enc_dec = num_params(with_training_vocab(from_configdict(load(f"g2p:{variant}"))))
  dec_only = num_params(with_training_vocab(from_configdict(load(f"g2p_decoder_only:{variant}"))))
  assert abs(dec_only - enc_dec) / enc_dec < 0.01, (dec_only, enc_dec)


def test_nanogpt_cpu_settings():
  """lm.py:nanogpt_cpu carries nanoGPT's CPU command's settings: 4 layers, 4 heads, d 128,
  block 64, batch 12, 2000 steps, lr 1e-3, dropout 0."""
  c = from_configdict(load("lm:nanogpt_cpu"))
  got = (c.model.num_decoder_layers, c.model.num_heads, c.model.d_model, c.data.max_target_len,
         c.data.batch_size, c.train.num_steps, c.train.learning_rate, c.model.dropout_rate)
  assert got == (4, 4, 128, 64, 12, 2000, 1e-3, 0.0)


def test_lm_moe_has_the_active_ffn_of_its_dense_counterpart():
  """lm.py:moe routes each token to 2 of 8 GELU experts of hidden 256: the active FFN FLOPs of
  lm.py:moe_dense (GELU, hidden 512), which is nanogpt_cpu; everything else is the same."""
  from transformer.run import reporting  # pylint: disable=g-import-not-at-top
  moe, dense = (from_configdict(load(f"lm:{v}")) for v in ("moe", "moe_dense"))
  assert dense == from_configdict(load("lm:nanogpt_cpu"))
  m = moe.model
  assert (m.ffn, m.moe_num_experts, m.moe_top_k, m.moe_expert_ffn) == ("moe", 8, 2, "gelu")
  assert m.moe_top_k * m.mlp_dim == dense.model.mlp_dim
  flops = [reporting.model_flops_per_step(dataclasses.replace(c.model, vocab_size=65), 12, 64, 64)
           for c in (moe, dense)]
  router = 3 * 2 * 12 * 64 * 128 * 8 * 4  # fwd + bwd of [d, 8] on 12 x 64 tokens, 4 layers
  assert flops[0] == flops[1] + router
  same = lambda c: dataclasses.replace(c, model=dataclasses.replace(
      c.model, ffn="gelu", mlp_dim=512, moe_expert_ffn="gelu", moe_capacity_factor=1.25))
  assert same(moe) == same(dense)


def _flat(d, prefix=""):
  return {k2: v2 for k, v in d.items()
          for k2, v2 in (_flat(v, f"{prefix}{k}.").items() if isinstance(v, dict)
                         else [(f"{prefix}{k}", v)])}


def test_g2p_best_is_fast_for_three_times_the_steps():
  """g2p.py:best is what its docstring and the README say it is, :fast's recipe (model,
  optimizer, schedule, data, decoding) with 3x the steps, dev/checkpoints every 2000 steps and
  dropout 0.1: every other key equal, so :best's measured results compare with :fast's on epochs
  and dropout alone."""
  fast, best = (_flat(load(f"g2p:{v}").to_dict()) for v in ("fast", "best"))
  differ = {k: (fast[k], best[k]) for k in fast if fast[k] != best[k]}
  assert fast.keys() == best.keys()
  assert differ == {"train.num_steps": (6000, 18000), "eval.every_steps": (1000, 2000),
                    "checkpoint.every_steps": (1000, 2000), "model.dropout_rate": (0.0, 0.1)}


def test_paper_base_recipe_in_wmt14():
  """wmt14_ende.py is the base model of Vaswani et al.: 6+6, 512, 8 heads, 2048, dropout 0.1,
  label smoothing 0.1, Adam 0.9/0.98/1e-9, rsqrt with 4000 warmup, shared ~37k BPE."""
  c = from_configdict(load("wmt14_ende:"))
  m, t = c.model, c.train
  assert (m.num_encoder_layers, m.num_decoder_layers, m.d_model, m.num_heads, m.mlp_dim) == (
      6, 6, 512, 8, 2048)
  assert (m.dropout_rate, t.label_smoothing, t.optimizer, t.b1, t.b2, t.eps) == (
      0.1, 0.1, "adam", 0.9, 0.98, 1e-9)
  assert (t.schedule, t.warmup_steps, c.data.spm_vocab_size, c.data.source_tokenizer) == (
      "rsqrt", 4000, 37000, "")


def test_config_error_type_is_value_error():
  """ConfigError is a ValueError (callers may catch either)."""
  assert issubclass(ConfigError, ValueError)


CONFIG_FILES = sorted(glob.glob(os.path.join(ROOT, "configs", "*.py")) +
                      glob.glob(os.path.join(ROOT, "configs", "sweeps", "*.py")))


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: os.path.relpath(p, ROOT))
def test_config_docstrings_are_short_and_carry_no_provenance(path):
  """A config module's docstring is at most 15 lines (what it is for, its command, where its
  results are reported) and names no commit: numbers and provenance live in docs/results/."""
  with open(path, encoding="utf-8") as f:
    doc = ast.get_docstring(ast.parse(f.read())) or ""
  assert len(doc.splitlines()) <= 15, f"{len(doc.splitlines())} lines"
  assert not re.search(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", doc), doc
