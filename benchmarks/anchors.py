"""Public reference implementations timed beside our train step: flax `examples/lm1b` and
`examples/wmt` (their `models.py` only) and nanoGPT's `model.py` (PyTorch), imported from a local
checkout, never copied here.

Layout of the anchors directory (`--anchors=DIR` or $TRANSFORMER_ANCHORS, default /tmp/anchors):
  DIR/flax/examples/lm1b/models.py, DIR/flax/examples/wmt/models.py   (github google/flax)
  DIR/nanoGPT/model.py                                                (github karpathy/nanoGPT)
e.g. `git --git-dir=FLAX.git archive HEAD examples/lm1b examples/wmt | tar -x -C DIR/flax`.

Each `make_*` returns a `step()` callable that runs one train step (forward, backward, AdamW
update) on random ids and blocks until it is done, or None with a note when the anchor is absent.
The steps around the anchors' models are written here (their train.py files need TensorFlow/clu):
cross-entropy on every token, AdamW (lr 1e-3, betas 0.9/0.99, weight decay 0.1 on matrices),
dropout 0, float32; lm1b/wmt jitted with donation; nanoGPT on torch's CPU threads
($BENCH_THREADS, default 2). Same widths as ours; their own choices stay (lm1b/wmt: sinusoidal
positions, ReLU, biases; nanoGPT: learned positions, GELU, tied head, no bias).
"""

import contextlib
import importlib.util
import io
import os
import sys
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_DIR = os.environ.get("TRANSFORMER_ANCHORS", "/tmp/anchors")
LR, B1, B2, WD = 1e-3, 0.9, 0.99, 0.1


def _load(path: str, name: str):
  """The module at `path` under a private name, or None if the file is absent."""
  if not os.path.exists(path):
    return None
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _adamw():
  import optax  # pylint: disable=g-import-not-at-top
  return optax.adamw(LR, b1=B1, b2=B2, weight_decay=WD,
                     mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p))


def _flax_step(model, example: tuple, loss_args: Callable) -> Callable[[], None]:
  """A jitted, donated AdamW step of a flax anchor model on fixed random arrays `example`."""
  import optax  # pylint: disable=g-import-not-at-top
  params = jax.jit(model.init)(jax.random.key(0), *example)["params"]
  tx = _adamw()

  def loss_fn(p, arrays):
    logits = model.apply({"params": p}, *arrays)
    return optax.softmax_cross_entropy_with_integer_labels(logits, loss_args(arrays)).mean()

  def step(p, o, arrays):
    loss, grads = jax.value_and_grad(loss_fn)(p, arrays)
    updates, o = tx.update(grads, o, p)
    return optax.apply_updates(p, updates), o, loss

  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, tx.init(params), example).compile()
  state = [params, tx.init(params)]

  def run():
    state[0], state[1], loss = compiled(state[0], state[1], example)
    loss.block_until_ready()
  return run


def _ids(rows: int, length: int, vocab: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).integers(1, vocab, (rows, length), dtype=np.int32)  # 0 = pad


def make_lm1b(anchors: str, layers: int, d: int, heads: int, mlp: int, seq: int, batch: int,
              vocab: int) -> tuple[Optional[Callable[[], None]], str]:
  """flax examples/lm1b TransformerLM at our decoder-only size (it shifts its inputs itself)."""
  models = _load(os.path.join(anchors, "flax", "examples", "lm1b", "models.py"), "_anchor_lm1b")
  if models is None:
    return None, f"lm1b skipped: no {anchors}/flax/examples/lm1b/models.py"
  cfg = models.TransformerConfig(
      vocab_size=vocab, output_vocab_size=vocab, dtype=jnp.float32, emb_dim=d, num_heads=heads,
      num_layers=layers, qkv_dim=d, mlp_dim=mlp, max_len=seq, dropout_rate=0.0,
      attention_dropout_rate=0.0, deterministic=True, decode=False)
  tokens = jnp.asarray(_ids(batch, seq, vocab, 0))
  return _flax_step(models.TransformerLM(cfg), (tokens,), lambda a: a[0]), "lm1b"


def make_wmt(anchors: str, layers: int, d: int, heads: int, mlp: int, src: int, tgt: int,
             batch: int, vocab: int) -> tuple[Optional[Callable[[], None]], str]:
  """flax examples/wmt Transformer (layers each side, shared embeddings, post-LN as written)."""
  models = _load(os.path.join(anchors, "flax", "examples", "wmt", "models.py"), "_anchor_wmt")
  if models is None:
    return None, f"wmt skipped: no {anchors}/flax/examples/wmt/models.py"
  cfg = models.TransformerConfig(
      vocab_size=vocab, output_vocab_size=vocab, share_embeddings=True, logits_via_embedding=True,
      dtype=jnp.float32, emb_dim=d, num_heads=heads, num_layers=layers, qkv_dim=d, mlp_dim=mlp,
      max_len=max(src, tgt), dropout_rate=0.0, attention_dropout_rate=0.0, deterministic=True,
      decode=False)
  arrays = (jnp.asarray(_ids(batch, src, vocab, 0)), jnp.asarray(_ids(batch, tgt, vocab, 1)))
  return _flax_step(models.Transformer(cfg), arrays, lambda a: a[1]), "wmt"


def make_nanogpt(anchors: str, layers: int, d: int, heads: int, seq: int, batch: int,
                 vocab: int) -> tuple[Optional[Callable[[], None]], str]:
  """nanoGPT's GPT (model.py) with its own configure_optimizers (AdamW), mlp 4 d as written."""
  path = os.path.join(anchors, "nanoGPT", "model.py")
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None, "nanoGPT skipped: torch is not installed"
  gpt = _load(path, "_anchor_nanogpt")
  if gpt is None:
    return None, f"nanoGPT skipped: no {path}"
  torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
  torch.manual_seed(0)
  conf = gpt.GPTConfig(block_size=seq, vocab_size=vocab, n_layer=layers, n_head=heads,
                       n_embd=d, dropout=0.0, bias=False)
  with contextlib.redirect_stdout(io.StringIO()):  # it prints parameter counts
    model = gpt.GPT(conf)
    opt = model.configure_optimizers(WD, LR, (B1, B2), "cpu")
  model.train()
  data = torch.from_numpy(_ids(batch, seq + 1, vocab, 0).astype(np.int64))
  x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()

  def run():
    _, loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss.item()
  return run, f"nanoGPT (torch {torch.__version__}, {torch.get_num_threads()} threads)"


def describe(anchors: str) -> str:
  """Which anchors DIR holds, for the report's first line."""
  have = [name for name, rel in (("lm1b", "flax/examples/lm1b/models.py"),
                                 ("wmt", "flax/examples/wmt/models.py"),
                                 ("nanoGPT", "nanoGPT/model.py"))
          if os.path.exists(os.path.join(anchors, rel))]
  return f"anchors {anchors}: " + (", ".join(have) if have else "none found (ours only)")


if __name__ == "__main__":
  print(describe(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_DIR))
