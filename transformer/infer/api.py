"""The notebook API: `restore(workdir)` gives a `Run` to decode, score and look inside.

  run = transformer.restore("runs/g2p", step="best")  # or params="raw", average_last=3
  run.generate_text(["hello", "world"], method="beam", beam_size=4)  # ['HH AH L OW', 'W ER L D']
  run.score(["hello"], ["HH AH L OW"])            # log p(target | source), summed over tokens
  att = run.attention("hello")                    # every layer and head, see `Attention`
  transformer.restore(["runs/a", "runs/b"])       # an ensemble: the mean probability
Encoder-only runs classify, tag or fill masks instead.
"""

import dataclasses
import sys
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from transformer.config import Config
from transformer.data import images as image_data, inputs, labels, load_task, objectives, pipeline
from transformer.data.tokenizers import NUM_SPECIAL
from transformer.infer import evaluation
from transformer.infer.decoding import search_settings
from transformer.model import ensemble, models


@dataclasses.dataclass
class Attention:
  """Attention weights of one example, one [heads, queries, keys] float32 array per layer; the
  tokens label them (target_tokens: the decoder inputs, for decoder-only prompt then output)."""
  source_tokens: list[str]
  target_tokens: list[str]
  encoder_self: list[np.ndarray]
  decoder_self: list[np.ndarray]
  cross: list[np.ndarray]


def _token_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
  """One display label per id: the unit's text, or <s> (the start), </s>, <bos>, <unk>."""
  names = {tokenizer.pad_id: "<s>", tokenizer.eos_id: "</s>", tokenizer.bos_id: "<bos>",
           tokenizer.unk_id: "<unk>"}
  return [names[i] if i in names else tokenizer.decode([i]) for i in map(int, ids)]


def _collect_weights(tree: Any) -> dict[tuple[str, str], list[np.ndarray]]:
  """(stack, kind) -> per-layer [b, n, t, s] weights from the sown 'intermediates' tree."""
  found: dict[tuple[str, str], dict[int, np.ndarray]] = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    keys = [str(getattr(p, "key", getattr(p, "idx", ""))) for p in path]
    if "attention_weights" not in keys:
      continue
    layer_keys = [k for k in keys if k.startswith("layers")]
    leaf = np.asarray(leaf, np.float32)
    slot = found.setdefault(("encoder" if "encoder" in keys else "decoder",  # (stack, kind)
                             "cross" if "cross_attention" in keys else "self"), {})
    if layer_keys and layer_keys[0] == "layers":  # scan_layers: layers stacked on axis 0
      slot.update(enumerate(leaf))
    else:
      slot[int(layer_keys[0].split("_")[1]) if layer_keys else 0] = leaf
  return {k: [v[i] for i in sorted(v)] for k, v in found.items()}


def _bucket(n: int) -> int:
  """Batch rows for n inputs: a power of two >= 4, so repeated calls reuse compiled decoders."""
  return max(4, 1 << max(0, n - 1).bit_length())


def _best_ids(logits: np.ndarray, vocab_size: int) -> np.ndarray:
  """The argmax of [..., n] logits over the ordinary ids NUM_SPECIAL..vocab_size."""
  return logits[..., NUM_SPECIAL:vocab_size].argmax(-1) + NUM_SPECIAL


def _ordinary_probs(logits: np.ndarray, vocab_size: int) -> np.ndarray:
  """The softmax of [..., n] logits over the ordinary ids (index i: id NUM_SPECIAL + i)."""
  return np.asarray(jax.nn.softmax(jnp.asarray(logits[..., NUM_SPECIAL:vocab_size]), axis=-1))


class Run:
  """A restored run; an ensemble's holds tuples of models, params and steps, and `members`."""

  def __init__(self, config: Config, model: Any, params: Any, task: Any, step: Any, workdir: str,
               params_source: str = "raw", averaged_steps: Sequence[int] = (),
               members: Sequence[str] = ()):
    self.config, self.model, self.params, self.task = config, model, params, task
    self.source_tokenizer, self.target_tokenizer = task.source_tokenizer, task.target_tokenizer
    self.step, self.workdir = step, workdir
    self.params_source = params_source  # 'ema' or 'raw' (restore.read_params)
    self.averaged_steps = tuple(averaged_steps)  # the checkpoints averaged; () = one checkpoint
    self.kind = getattr(task, "kind", "seq2seq")
    self.members = tuple(members)  # the workdirs of an ensemble; () for one run
    self._forward = jax.jit(self._logits_fn)

  def __repr__(self) -> str:
    if self.members:
      return (f"Run(ensemble of {len(self.members)}: {list(self.members)}, step={list(self.step)}, "
              f"params={self.params_source!r})")
    m = self.config.model
    averaged = f", averaged_steps={list(self.averaged_steps)}" if self.averaged_steps else ""
    encoder = m.num_encoder_layers if m.arch != "decoder_only" else 0  # the stacks it has
    decoder = m.num_decoder_layers if m.arch != "encoder_only" else 0
    return (f"Run({self.workdir!r}, step={self.step}, params={self.params_source!r}{averaged}, "
            f"arch={m.arch}, d_model={m.d_model}, layers={encoder}+{decoder})")

  def encode_source(self, text: str) -> list[int]:
    """Encoder input (or decoder-only prompt) ids of `text`, EOS included for seq2seq tasks."""
    return evaluation.source_ids(self.task, text)

  def _teacher_forced_batch(self, sources: Sequence[str], targets: Sequence[str],
                            multiple: int = 8) -> dict[str, np.ndarray]:
    """(source, target) pairs built as training builds them, one per row, sources truncated."""
    if self.kind == "seq2seq":
      examples, _ = pipeline.encode_pairs(
          list(zip(sources, targets)), self.source_tokenizer, self.target_tokenizer,
          self.config.data.max_source_len, sys.maxsize, "truncate",
          self.config.model.arch == "decoder_only")
    else:  # language model: prompt + target + EOS as one causal row, every token scored
      tok = self.target_tokenizer
      examples = pipeline.Examples.from_lists({"targets": [
          self.encode_source(s) + list(tok.encode(t)) + [tok.eos_id]
          for s, t in zip(sources, targets)]})
    row_len = {name: -(-max(1, int(lengths.max())) // multiple) * multiple
               for name, lengths in examples.lengths.items()}
    return pipeline.one_per_row(examples, np.arange(len(examples)), row_len, len(examples))

  def _logits_fn(self, params, batch):
    """The model's logits; an ensemble's: the log of its members' mean probability."""
    members, trees = ensemble.members(self.model, params)
    return ensemble.log_mean_probs([models.batch_logits(m, p, batch)
                                    for m, p in zip(members, trees)])

  def logits(self, sources: Sequence[str], targets: Sequence[str]) -> np.ndarray:
    """Teacher-forced logits [b, t, vocab] float32 (decoder-only: over prompt + target)."""
    batch = self._teacher_forced_batch(sources, targets)
    batch = {k: v for k, v in batch.items() if k != "weights"}
    return np.asarray(self._forward(self.params, batch))

  def score(self, sources: Sequence[str], targets: Sequence[str]) -> np.ndarray:
    """log p(target + EOS | source) [b] in nats, summed over the target tokens."""
    if len(sources) != len(targets):
      raise ValueError(f"score: {len(sources)} sources but {len(targets)} targets")
    batch = self._teacher_forced_batch(sources, targets)
    logits = self._forward(self.params, {k: v for k, v in batch.items() if k != "weights"})
    log_probs = jax.nn.log_softmax(jnp.asarray(logits), axis=-1)
    picked = np.asarray(jnp.take_along_axis(log_probs, batch["targets"][..., None], -1))[..., 0]
    return (picked * batch["weights"]).sum(axis=1)

  def generate_text(self, texts: Sequence[str] | str, method: str | None = None,
               beam_size: int | None = None, temperature: float | None = None,
               top_k: int | None = None, top_p: float | None = None,
               length_penalty: float | None = None, max_decode_len: int | None = None,
               seed: int = 0) -> list[str]:
    """Decodes each text (unset options: eval.decode's); bad input is a one-line ValueError."""
    options = dict(method=method, beam_size=beam_size, temperature=temperature, top_k=top_k,
                   top_p=top_p, length_penalty=length_penalty, max_decode_len=max_decode_len)
    decode_cfg = dataclasses.replace(self.config.eval.decode,
                                     **{k: v for k, v in options.items() if v is not None})
    model_cfg = ensemble.members(self.model, self.params)[0][0].config
    search_settings(decode_cfg, model_cfg.vocab_size, model_cfg.max_len)
    texts = inputs.checked_texts(self, [texts] if isinstance(texts, str) else texts, max_decode_len)
    ids = [self.encode_source(t) for t in texts]
    tok = self.target_tokenizer
    tokens, _ = evaluation.decode_batches(self.config, self.model, self.params, ids, decode_cfg,
                                          eos_id=tok.eos_id, batch_size=_bucket(len(ids)),
                                          rng=jax.random.key(seed),
                                          prefix_lm=None if self.kind == "seq2seq" else False)
    return [tok.decode(t) for t in tokens]

  def _encoder_logits(self, rows: Sequence[Sequence[int]], head: str) -> np.ndarray:
    """Head logits of encoder rows (BOS + ids + EOS), one per batch row, padded."""
    if self.config.model.arch != "encoder_only" or self.config.model.head != head:
      raise ValueError(f"this run is model.arch={self.config.model.arch!r} with model.head="
                       f"{self.config.model.head!r}; this method needs head {head!r}")
    width = -(-max(len(r) for r in rows) // 8) * 8
    array = np.zeros((_bucket(len(rows)), width), np.int32)
    for i, row in enumerate(rows):
      array[i, :len(row)] = row
    return np.asarray(self._forward(self.params, {"inputs": array}))[:len(rows)]

  def _encoder_rows(self, texts: Sequence[str] | str) -> list[list[int]]:
    """BOS + ids + EOS of each text, truncated to data.max_source_len as training's rows."""
    return labels.encoder_rows([texts] if isinstance(texts, str) else list(texts),
                               self.source_tokenizer, self.config.data.max_source_len,
                               "truncate")[0]

  def image_inputs(self, images: Any) -> np.ndarray:
    """Images as the model reads them, [b, H, W, C] in [-1, 1], from one image or a batch of
    pixels in [0, 1] (uint8: in [0, 255]); [H, W] and [b, H, W] are one channel."""
    m = self.config.model
    if not m.image_size:
      raise ValueError("this run reads tokens, not images (model.image_size=0)")
    shape = (m.image_size, m.image_size, m.image_channels)
    try:
      array = np.asarray(images)
    except ValueError:  # numpy's "inhomogeneous shape": a list of images of different shapes
      raise ValueError(f"images of different shapes: this run takes images {shape} (H, W, C), "
                       "all of them that shape") from None
    if array.dtype.kind not in "uifb":
      what = "text" if array.dtype.kind in "US" else f"{array.dtype} values"
      raise ValueError(f"this run classifies images (model.image_size={m.image_size}): give "
                       f"arrays of pixels, not {what}")
    array = image_data.to_unit_range(array, "images")
    if m.image_channels == 1 and array.shape[-2:] == shape[:2]:
      array = array[..., None]  # [.., H, W] -> [.., H, W, 1]
    if array.shape == shape:
      array = array[None]
    if array.ndim != 4 or array.shape[1:] != shape or not len(array):
      raise ValueError(f"images of shape {np.shape(images)}: this run takes an image {shape} "
                       f"(H, W, C; pixels in [0, 1] or uint8) or a batch [b, *{shape}]")
    return image_data.normalize(array)

  def _image_logits(self, images: Any) -> np.ndarray:
    """Class logits [b, classes] of images (see image_inputs), in batches of a bucketed size."""
    array = self.image_inputs(images)
    batch = np.zeros((_bucket(len(array)),) + array.shape[1:], np.float32)
    batch[:len(array)] = array
    return np.asarray(self._forward(self.params, {"images": batch}))[:len(array), 0]

  def classify_with_probability(self, texts: Sequence[str] | str) -> list[tuple[str, float]]:
    """(predicted label, its probability) of each text (model.head='classify'); a ViT's
    (model.image_size > 0) of each image, pixels in [0, 1] (see _image_batch)."""
    if self.config.model.image_size:
      logits = self._image_logits(texts)
    else:
      rows = self._encoder_rows(texts)
      logits = self._encoder_logits(rows, "classify")[:, 0]  # slot 0: the row's one example
    tok = self.target_tokenizer
    best, probs = _best_ids(logits, tok.vocab_size), _ordinary_probs(logits, tok.vocab_size)
    return [(tok.decode([int(i)]), float(p[i - NUM_SPECIAL])) for i, p in zip(best, probs)]

  def classify(self, texts: Sequence[str] | str) -> list[str]:
    """The predicted label of each text (a classification run: model.head='classify')."""
    return [label for label, _ in self.classify_with_probability(texts)]

  def tag(self, texts: Sequence[str] | str) -> list[list[tuple[str, str]]]:
    """(token, predicted tag) for every source token of each text (model.head='tag')."""
    rows = self._encoder_rows(texts)
    best = _best_ids(self._encoder_logits(rows, "tag"), self.target_tokenizer.vocab_size)
    return [[(self.source_tokenizer.decode([t]), self.target_tokenizer.decode([int(b)]))
             for t, b in zip(row[1:-1], best[r, 1:len(row) - 1])] for r, row in enumerate(rows)]

  def _mask_rows(self, texts: Sequence[str] | str, mask: str
                 ) -> tuple[list[list[int]], int, np.ndarray]:
    """(BOS + ids + EOS per text, each `mask` marker one [MASK]; the [MASK] id; their logits)."""
    tok = self.source_tokenizer
    mask_id = objectives.ExtraIds(tok.vocab_size).mask_id
    rows = []
    for text in [texts] if isinstance(texts, str) else texts:
      pieces = [tok.encode(p) for p in text.split(mask)]
      ids = [t for i, p in enumerate(pieces) for t in ([mask_id] if i else []) + p]
      rows.append([tok.bos_id] + ids + [tok.eos_id])
    return rows, mask_id, self._encoder_logits(rows, "mlm")

  def mask_fillers(self, texts: Sequence[str] | str, k: int = 5, mask: str = "_"
                   ) -> list[list[list[tuple[str, float]]]]:
    """Per text and `mask` marker, the k likeliest ordinary tokens there and their probabilities."""
    if k < 1:
      raise ValueError(f"top_k={k} must be >= 1")
    tok = self.source_tokenizer
    rows, mask_id, logits = self._mask_rows(texts, mask)
    probs = _ordinary_probs(logits, tok.vocab_size)
    out = []
    for r, row in enumerate(rows):
      at = [i for i, t in enumerate(row) if t == mask_id]
      ranked = [np.argsort(-logits[r, i, NUM_SPECIAL:tok.vocab_size], kind="stable")[:k]
                for i in at]
      out.append([[(tok.decode([int(j) + NUM_SPECIAL]), float(probs[r, i, j])) for j in order]
                  for i, order in zip(at, ranked)])
    return out

  def fill_mask(self, texts: Sequence[str] | str, mask: str = "_") -> list[str]:
    """Each text with every `mask` marker replaced by the masked LM's most likely token."""
    tok = self.source_tokenizer
    rows, mask_id, logits = self._mask_rows(texts, mask)
    best = _best_ids(logits, tok.vocab_size)
    filled = [[int(best[r, i]) if t == mask_id else t for i, t in enumerate(row)]
              for r, row in enumerate(rows)]
    return [tok.decode(f[1:-1]) for f in filled]

  def attention(self, text: str, target: str | None = None) -> Attention:
    """Every layer's and head's attention for `text` and `target` (default: the greedy output)."""
    if self.members:
      raise ValueError(f"attention: this Run is an ensemble of {len(self.members)} runs; restore "
                       "one of them to look at its attention")
    if self.config.model.image_size:  # `text` is an image
      batch = {"images": jnp.asarray(self.image_inputs(text)[:1])}
    elif self.config.model.arch == "encoder_only":
      batch = {"inputs": jnp.asarray(self._encoder_rows([text]))}
    else:
      if target is None:
        target = self.generate_text([text], method="greedy")[0]
      batch = self._teacher_forced_batch([text], [target], multiple=1)  # exact lengths, no padding
      batch = {k: jnp.asarray(v) for k, v in batch.items() if k != "weights"}
    found = _collect_weights(models.batch_intermediates(self.model, self.params, batch))
    first = lambda key: [w[0] for w in found.get(key, [])]  # noqa: E731  (batch of one)
    source, target_labels = [], []
    if "images" in batch:  # the class token, then the patches row-major
      m = self.config.model
      cls = ["<cls>"] if m.pooling == "class_token" else []
      source = cls + [f"patch {i}" for i in range((m.image_size // m.patch_size) ** 2)]
    if "inputs" in batch:
      source = _token_labels(self.source_tokenizer, np.asarray(batch["inputs"])[0])
    if "targets" in batch:
      decoder_inputs = np.asarray(models.shift_right(batch["targets"]))[0]
      target_labels = _token_labels(self.target_tokenizer, decoder_inputs)
      if "inputs" not in batch and self.kind == "seq2seq":  # a decoder-only prompt: source ids
        prompt = self.encode_source(text)
        target_labels[1:len(prompt) + 1] = _token_labels(self.source_tokenizer, prompt)
    return Attention(source, target_labels, encoder_self=first(("encoder", "self")),
                     decoder_self=first(("decoder", "self")), cross=first(("decoder", "cross")))


def attention_rollout(layers: Sequence[np.ndarray]) -> np.ndarray:
  """Abnar & Zuidema's attention rollout of per-layer weights [heads, t, t]: the product, last
  layer first, of each layer's head mean with the residual's identity added, rows renormalised."""
  rollout = None
  for weights in layers:
    a = np.asarray(weights, np.float64).mean(0)
    a = 0.5 * a + 0.5 * np.eye(a.shape[-1])
    a /= a.sum(-1, keepdims=True)
    rollout = a if rollout is None else a @ rollout
  return rollout


def image_attention_map(run: Run, image: Any, method: str = "rollout") -> np.ndarray:
  """What a ViT's output reads of each patch, [grid, grid] over the image: the class token's row
  (mean pooling: every token's row, averaged) of the attention rollout ('rollout') or of the last
  layer's head-mean attention ('last')."""
  m = run.config.model
  if not m.image_size:
    raise ValueError("image_attention_map needs a ViT run (model.image_size > 0)")
  layers = run.attention(image).encoder_self
  if method == "rollout":
    weights = attention_rollout(layers)
  elif method == "last":
    weights = np.asarray(layers[-1], np.float64).mean(0)
  else:
    raise ValueError(f"method={method!r} is not one of rollout|last")
  cls = m.pooling == "class_token"
  row = weights[0, 1:] if cls else weights.mean(0)
  grid = m.image_size // m.patch_size
  return row.reshape(grid, grid)


def restore(workdir: str | Sequence[str], step: int | str | None = None, task: Any = None,
            params: str = "auto", average_last: int = 0) -> Run:
  """Restores the run in `workdir` (step: None/'latest', 'best' or an int; `params` and
  `average_last` as restore.read_params) as a `Run`; a list of workdirs restores their ensemble."""
  workdirs = [workdir] if isinstance(workdir, str) else list(workdir)
  configs, restored = evaluation.read_members(workdirs, {}, step, params, average_last)
  task = load_task(configs[0], workdirs[0]) if task is None else task
  if len(workdirs) == 1:
    (cfg,), (one,) = configs, restored
    return Run(cfg, models.build_model(cfg.model), one.params, task, one.step, workdirs[0],
               params_source=one.source, averaged_steps=one.steps if average_last else ())
  return Run(configs[0], tuple(models.build_model(c.model) for c in configs),
             tuple(r.params for r in restored), task, tuple(r.step for r in restored),
             workdirs[0], params_source=restored[0].source, members=workdirs)
