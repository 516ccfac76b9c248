# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Exploring a G2P transformer
#
# Restores the README quickstart's run, `runs/g2p_tiny` (`configs/g2p.py:tiny`), training it first
# only if that directory holds no checkpoints; decodes a few words with every decoding method,
# scores pronunciations, and looks inside: attention maps of every kind, the sinusoidal
# positional encoding and the learning curves. Last, if there are any, a Hugging Face GPT-2 and
# a BERT converted into workdirs (`python -m transformer.convert --from_hf=DIR
# --workdir=runs/gpt2`, and `runs/bert`): their attention maps and the positional embeddings they
# learned.
#
# This file is the source (jupytext percent format); `explore.ipynb` is generated from it with
# `jupytext --to notebook notebooks/explore.py`. Start it from the repository root or from
# `notebooks/`. The parameters below can also be set by environment variables (that is how the
# test runs it headless on another run).

# %% tags=["parameters"]
import os

# Jupyter starts a notebook in its own directory; the quickstart's paths are relative to the root.
ROOT = os.getcwd() if os.path.exists("train.py") else os.path.dirname(os.getcwd())
WORKDIR = os.environ.get("EXPLORE_WORKDIR") or os.path.join(ROOT, "runs", "g2p_tiny")
FIG_DIR = os.environ.get("EXPLORE_FIG_DIR") or os.path.join(WORKDIR, "figures")
WORDS = ["phoneme", "attention", "transformer", "jax"]
HF_WORKDIR = os.environ.get("EXPLORE_HF_WORKDIR") or os.path.join(ROOT, "runs", "gpt2")
HF_TEXT = "The quick brown fox jumps over the lazy dog."
BERT_WORKDIR = os.environ.get("EXPLORE_BERT_WORKDIR") or os.path.join(ROOT, "runs", "bert")
BERT_TEXT = "paris is the _ of france."
VIT_WORKDIR = os.environ.get("EXPLORE_VIT_WORKDIR") or os.path.join(ROOT, "runs", "vit_tiny")

# %% [markdown]
# ## Restore (or train)
# A workdir that already holds checkpoints is restored as it is. Otherwise `configs/g2p.py:tiny`
# is trained there first, exactly as the quickstart's `python train.py
# --config=configs/g2p.py:tiny --workdir=runs/g2p_tiny` does (a few minutes on 2 CPU cores).

# %%
import transformer
from transformer.infer import viz
from transformer.run import curves

if not os.path.isdir(os.path.join(WORKDIR, "checkpoints")):
  import sys
  sys.path.insert(0, ROOT)  # configs/ is a directory of the checkout, not an installed package
  from configs import g2p
  print(transformer.train_and_evaluate(g2p.get_config("tiny"), WORKDIR))

run = transformer.restore(WORKDIR)
run

# %% [markdown]
# ## Decoding with every method
# Greedy and beam search are deterministic; sampling draws from the temperature-scaled, top-k and
# nucleus (top-p) filtered distribution (each filter can be used alone) and is reproducible
# through `seed`.

# %%
methods = {
    "greedy": dict(method="greedy"),
    "beam 4": dict(method="beam", beam_size=4),
    "sample": dict(method="sample", temperature=0.8, top_k=5, top_p=0.95, seed=0),
}
outputs = {name: run.generate_text(WORDS, **kw) for name, kw in methods.items()}
for i, word in enumerate(WORDS):
  print(word)
  for name, hyps in outputs.items():
    print(f"  {name:<13} {hyps[i]}")

# %% [markdown]
# `score` gives log p(pronunciation | word): the model prefers its own beam output to a sample.

# %%
beam, sampled = outputs["beam 4"], outputs["sample"]
for word, b, s, lb, ls in zip(WORDS, beam, sampled, run.score(WORDS, beam), run.score(WORDS, sampled)):
  print(f"{word:<12} beam {lb:8.3f} ({b})   sample {ls:8.3f} ({s})")

# %% [markdown]
# ## Attention
# Every layer and head: encoder self-attention over the letters, decoder self-attention over the
# phones produced so far, and cross-attention from each phone to the letters (for a trained G2P
# model roughly monotonic: an alignment).

# %%
os.makedirs(FIG_DIR, exist_ok=True)
att = run.attention(WORDS[0])
last = len(att.cross) - 1
viz.plot_attention(att.encoder_self[-1], att.source_tokens, att.source_tokens,
                   title=f"encoder self-attention, layer {last}",
                   save_path=os.path.join(FIG_DIR, "encoder_self.png"))
viz.plot_attention(att.decoder_self[-1], att.target_tokens, att.target_tokens,
                   title=f"decoder self-attention, layer {last}",
                   save_path=os.path.join(FIG_DIR, "decoder_self.png"))
viz.plot_attention(att.cross[-1], att.target_tokens, att.source_tokens,
                   title=f"cross-attention, layer {last}", save_path=os.path.join(FIG_DIR, "cross.png"));

# %% [markdown]
# ## Positional encoding
# The sinusoidal table (Vaswani et al. 2017) and the dot products between positions: the
# similarity depends on the distance between two positions, which lets attention find relative
# offsets.

# %%
viz.plot_positional_encoding(max_len=64, d_model=run.config.model.d_model,
                             save_path=os.path.join(FIG_DIR, "positional.png"));

# %% [markdown]
# ## Learning curves

# %%
curves.plot_learning_curves(WORKDIR, save_path=os.path.join(FIG_DIR, "curves.png"));
print(sorted(os.listdir(FIG_DIR)))

# %% [markdown]
# ## A converted GPT-2
# Skipped unless `HF_WORKDIR` holds a converted checkpoint. GPT-2 learned its positions: the table
# and the similarity between positions show what it made of them; its attention maps show the
# heads of the last layer over a sentence (after the start token, GPT-2's <|endoftext|>).

# %%
if os.path.isdir(os.path.join(HF_WORKDIR, "checkpoints")):
  gpt2 = transformer.restore(HF_WORKDIR)
  positions = gpt2.params["decoder"]["position_embed"]["embedding"]
  viz.plot_positional_encoding(table=positions[:64],
                               save_path=os.path.join(FIG_DIR, "gpt2_positional.png"))
  att = gpt2.attention(HF_TEXT, target="")  # the text as it is, nothing generated
  viz.plot_attention(att.decoder_self[-1], att.target_tokens, att.target_tokens,
                     title=f"GPT-2 self-attention, layer {len(att.decoder_self) - 1}",
                     save_path=os.path.join(FIG_DIR, "gpt2_attention.png"))
else:
  print(f"no converted GPT-2 in {HF_WORKDIR}")

# %% [markdown]
# ## A converted BERT
# Skipped unless `BERT_WORKDIR` holds a converted checkpoint (`python -m transformer.convert
# --from_hf=bert_base_uncased_dir --workdir=runs/bert`). The masked LM fills the `_` of
# `BERT_TEXT`; BERT learned its positions too (the table folds in the type-0 embedding, see
# `transformer/convert/bert.py`); its encoder's last layer attends over [CLS] (shown as <bos>),
# the text and [SEP] (</s>) in both directions.

# %%
if os.path.isdir(os.path.join(BERT_WORKDIR, "checkpoints")):
  bert = transformer.restore(BERT_WORKDIR)
  print(bert.fill_mask(BERT_TEXT), bert.mask_fillers(BERT_TEXT, k=5))
  positions = bert.params["encoder"]["position_embed"]["embedding"]
  viz.plot_positional_encoding(table=positions[:64],
                               save_path=os.path.join(FIG_DIR, "bert_positional.png"))
  att = bert.attention(BERT_TEXT.replace("_", "capital"))
  viz.plot_attention(att.encoder_self[-1], att.source_tokens, att.source_tokens,
                     title=f"BERT self-attention, layer {len(att.encoder_self) - 1}",
                     save_path=os.path.join(FIG_DIR, "bert_attention.png"))
else:
  print(f"no converted BERT in {BERT_WORKDIR}")

# %% [markdown]
# ## A Vision Transformer on digits
# Skipped unless `VIT_WORKDIR` holds a trained ViT (`python train.py --config=configs/vit.py:tiny
# --workdir=runs/vit_tiny`, a few CPU minutes). It classifies test images of the digits (pixels
# in [0, 1]) and shows where its class token reads: the attention rollout over the layers (each
# layer's head mean plus the residual's identity, multiplied), one cell per 2x2-pixel patch.

# %%
if os.path.isdir(os.path.join(VIT_WORKDIR, "checkpoints")):
  vit = transformer.restore(VIT_WORKDIR, step="best")
  pixels, labels = vit.task.split("test")
  print("predicted", vit.classify(pixels[:8]), "true", [str(y) for y in labels[:8]])
  for method in ("rollout", "last"):
    viz.plot_image_attention(pixels[0], transformer.image_attention_map(vit, pixels[0], method),
                             title=f"class token -> patches ({method})",
                             save_path=os.path.join(FIG_DIR, f"vit_attention_{method}.png"))
else:
  print(f"no trained ViT in {VIT_WORKDIR}")
