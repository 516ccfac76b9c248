"""`load_task(cfg, workdir)`: dataset + tokenizers + pipelines behind one small `Task` object."""

import hashlib
import json
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

from absl import logging
import numpy as np

from transformer import files
from transformer.config import ConfigError
from transformer.data import builders, denoise, images, labels, objectives, pipeline, tokenizers

# TFDS warns "Using custom data configuration" for each builder config; every one of ours is.
logging.get_absl_logger().addFilter(
    lambda r: not r.getMessage().startswith("Using custom data configuration"))


def _text(value: Any) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def read_records(source: Sequence[Any], keys: Sequence[str]) -> list[tuple[str, ...]]:
  """The text features `keys` of every record of `source`."""
  return [tuple(_text(r[k]) for k in keys) for r in builders.records(source)]


def _digest_path(path: str) -> str:
  """A records cache's digest file: `.<name>.sha256` beside it (the sha256 of its bytes)."""
  directory, name = os.path.split(path)
  return os.path.join(directory, f".{name}.sha256")


def write_cache(path: str, records: Sequence[tuple[str, ...]]) -> None:
  """Writes a records cache (JSON) and then its digest file beside it."""
  data = json.dumps(records, ensure_ascii=False).encode("utf-8")
  files.write_bytes_atomic(path, data)
  files.write_text_atomic(_digest_path(path), hashlib.sha256(data).hexdigest())


def read_cache(path: str) -> list[tuple[str, ...]] | None:
  """The records of a cache file, or None (with a warning) unless its bytes match its digest."""
  data = files.read_bytes(path)
  digest = _digest_path(path)
  recorded = files.read_text(digest).strip() if files.exists(digest) else ""
  if hashlib.sha256(data).hexdigest() != recorded:
    logging.warning("%s differs from its digest %s: reading the prepared records again", path,
                    digest)
    return None
  return [tuple(r) for r in json.loads(data.decode("utf-8"))]


def _get_tokenizer(d: Any, kind: str, key: str, root: str, workdir_dir: str | None,
                   texts) -> tokenizers.Tokenizer:
  """workdir copy if present, else the one saved next to the data, else built from `texts()`
  (kind 'hf': read from data.hf_tokenizer, never cached next to the data)."""
  if workdir_dir and files.exists(os.path.join(workdir_dir, "tokenizer.json")):
    return tokenizers.load(workdir_dir)
  name = f"{key}-{kind}" + (f"-{d.spm_model_type}-{d.spm_vocab_size}"
                            if kind == "sentencepiece" else "")
  data_copy = os.path.join(root, "tokenizers", name)
  if kind == "hf":
    tok = tokenizers.build(kind, (), hf_tokenizer=d.hf_tokenizer, hf_id_offset=d.hf_id_offset)
  elif files.exists(os.path.join(data_copy, "tokenizer.json")):
    tok = tokenizers.load(data_copy)
  else:
    logging.info("Building the %s tokenizer of %s from the training split.", kind, key)
    tok = tokenizers.build(kind, texts(), spm_vocab_size=d.spm_vocab_size,
                           spm_model_type=d.spm_model_type)
    try:
      if files.isdir(root):  # not for mocked catalog data, which has no directory
        tok.save(data_copy)
    except OSError as e:  # a read-only data_dir: the workdir copy is still written below
      logging.warning("Could not save the tokenizer to %s: %s", data_copy, e)
  if workdir_dir:
    tok.save(workdir_dir)
  return tok


class Task:
  """A dataset with its tokenizers and pipelines, as training, evaluation and the API read it."""

  def __init__(self, cfg: Any, workdir: str | None = None, *, process_index: int | None = None,
               process_count: int | None = None):
    d = cfg.data
    self.data_config, self.arch = d, cfg.model.arch
    if process_index is None or process_count is None:
      import jax  # pylint: disable=g-import-not-at-top  (only when the caller gives no host)
      process_index, process_count = jax.process_index(), jax.process_count()
    if d.batch_size % process_count:
      raise ValueError(f"data.batch_size={d.batch_size} is not divisible by the "
                       f"{process_count} hosts")
    self.process_index, self.process_count = process_index, process_count
    self.eval_batch_size = getattr(cfg.eval, "batch_size", 0) or d.batch_size
    self._cache: dict[str, list[tuple[str, ...]]] = {}
    self.stats: dict[str, Any] = {}
    tok_dir = lambda side: os.path.join(workdir, "tokenizers", side) if workdir else None
    if not d.dataset:  # a model without data (transformer/convert/): its workdir's tokenizer
      self._saved_tokenizers(workdir, tok_dir)
      return
    self.dataset = builders.open_dataset(d)
    self.kind = self.dataset.kind
    self.head = cfg.model.head if self.arch == "encoder_only" else ""
    self._check_kind(d)
    self._example_cache: dict[tuple[str, str], tuple[pipeline.Examples, dict[str, int]]] = {}
    self._tokenizers(d, workdir, tok_dir)
    self._objective(d)

  def _saved_tokenizers(self, workdir: str | None, tok_dir: Any) -> None:
    """A model without data: the tokenizers saved in its workdir."""
    if not workdir:
      raise ValueError("data.dataset is unset: a model without data needs its workdir")
    self.dataset, self.source_tokenizer = None, None
    self.target_tokenizer = tokenizers.load(tok_dir("target"))
    self.kind = "lm" if self.arch == "decoder_only" else "seq2seq"
    if self.kind == "seq2seq":  # an encoder-decoder (T5): the source's tokenizer is saved too
      source = tok_dir("source")
      self.source_tokenizer = (tokenizers.load(source) if files.exists(
          os.path.join(source, "tokenizer.json")) else self.target_tokenizer)

  def _check_kind(self, d: Any) -> None:
    """ValueError if the dataset's kind does not suit the architecture, head or label."""
    if self.kind == "lm" and self.arch != "decoder_only" and d.objective == "none":
      raise ValueError(f"data.dataset={d.dataset!r} is a language-modelling task: set "
                       f"model.arch='decoder_only' (or data.objective=mlm|span)")
    if self.head in ("classify", "tag") and self.kind == "lm":
      raise ValueError(f"model.head={self.head!r} needs a dataset of (text, label) pairs, "
                       f"not the language-modelling {d.dataset!r}")
    if d.label != "none" and self.kind == "lm":
      raise ValueError(f"data.label={d.label!r} needs cmudict_g2p/stress, not {d.dataset!r}")

  def _tokenizers(self, d: Any, workdir: str | None, tok_dir: Any) -> None:
    """The source and target tokenizers: trained on the training split, or the workdir's."""
    ds = self.dataset
    train = lambda: self._records(d.train_split)
    get = lambda kind, key, side, texts: _get_tokenizer(d, kind, key, ds.root, tok_dir(side), texts)
    target_key = ds.target_key + ("" if d.label == "none" else f":{d.label}")  # labels, not phones
    if self.kind == "lm":
      self.target_tokenizer = get(d.tokenizer, ds.target_key, "target",
                                  lambda: [r[0] for r in train()])
      # Not decoder-only: an objective over the text, which the encoder reads.
      self.source_tokenizer = None if self.arch == "decoder_only" else self.target_tokenizer
    elif not d.source_tokenizer:  # one tokenizer for both sides
      self.target_tokenizer = get(d.tokenizer, f"{ds.source_key}+{target_key}", "target",
                                  lambda: [t for r in train() for t in r])
      self.source_tokenizer = self.target_tokenizer
      if workdir:
        self.target_tokenizer.save(tok_dir("source"))
    else:
      self.source_tokenizer = get(d.source_tokenizer, ds.source_key, "source",
                                  lambda: [r[0] for r in train()])
      self.target_tokenizer = get(d.tokenizer, target_key, "target",
                                  lambda: [r[1] for r in train()])
      if self.arch == "decoder_only":  # one embedding table: target ids after the source's
        self.target_tokenizer = tokenizers.OffsetTokenizer(
            self.target_tokenizer, self.source_tokenizer.vocab_size - tokenizers.NUM_SPECIAL)

  def _objective(self, d: Any) -> None:
    """data.objective's denoising transform and its extra ids (None without one)."""
    self.extra_ids, self.transform = None, None
    if d.objective != "none":
      self.extra_ids = objectives.ExtraIds(self.source_tokenizer.vocab_size)
      if d.objective == "mlm":
        starts = (denoise.word_starts_fn(self.source_tokenizer) if d.whole_word_masking
                  else None)
        self.transform = denoise.MaskedLM(self.extra_ids, d.shuffle_seed, d.mask_rate, starts)
      else:
        self.transform = denoise.SpanCorruption(self.extra_ids, d.shuffle_seed, d.noise_density,
                                                d.mean_span_length)
        _, targets = denoise.span_lengths([d.max_source_len - 1], d.noise_density,
                                          d.mean_span_length)
        if targets[0] > d.max_target_len:
          raise ValueError(f"data.max_target_len={d.max_target_len} is too short for the spans "
                           f"of a {d.max_source_len - 1}-token example ({targets[0]} tokens)")

  @property
  def decodes(self) -> bool:
    """Whether the task's metrics come from decoding (seq2seq without an objective)."""
    return self.kind != "lm" and self.arch != "encoder_only" and self.transform is None

  def records(self, split: str) -> list[tuple[str, ...]]:
    """All records of `split` as text tuples (read once, its records cache written if missing)."""
    return self._records(split)

  def _records(self, split: str) -> list[tuple[str, ...]]:
    """All records of `split` as text tuples: read once, kept, and cached as JSON next to the
    prepared data (decoding array_record protos is slow)."""
    if self.dataset is None:
      raise ValueError(f"data.dataset is unset: this workdir holds a model without data (split "
                       f"{split!r}); a GPT-2 converts again with --text_file, any run fine-tunes "
                       f"with train.py --init_from and a dataset")
    if split not in self._cache:
      source, ds = self.dataset.source(split), self.dataset
      keys = (ds.target_key,) if self.kind == "lm" else (ds.source_key, ds.target_key)
      path = os.path.join(ds.root, "cache", f"{split}-{'+'.join(keys)}-{len(source)}.json")
      cached = read_cache(path) if files.exists(path) else None
      self._cache[split] = read_records(source, keys) if cached is None else cached
      if cached is None and files.isdir(ds.root):  # mocked catalog data has no directory
        try:
          files.makedirs(os.path.dirname(path))
          write_cache(path, self._cache[split])
        except OSError as e:
          logging.warning("Could not cache %s records to %s: %s", split, path, e)
    if self.data_config.label != "none":  # words with class labels instead of phones
      return labels.word_labels(self._cache[split], self.data_config.label)
    return self._cache[split]

  @property
  def row_len(self) -> dict[str, int]:
    """Row length of each token feature of a batch."""
    d = self.data_config
    if self.arch == "encoder_only":
      return {"inputs": d.max_source_len,
              "targets": d.max_target_len if self.head == "classify" else d.max_source_len}
    if self.arch == "decoder_only":  # an lm's rows, or prompt + target
      return {"targets": d.max_target_len + (0 if self.kind == "lm" else d.max_source_len)}
    return {"inputs": d.max_source_len, "targets": d.max_target_len}

  def _examples(self, split: str, too_long: str) -> tuple[pipeline.Examples, dict[str, int]]:
    """Tokenized examples of `split` (computed once per split and too_long rule)."""
    if (split, too_long) not in self._example_cache:
      self._example_cache[split, too_long] = self._encode(split, too_long)
    return self._example_cache[split, too_long]

  def _encode(self, split: str, too_long: str) -> tuple[pipeline.Examples, dict[str, int]]:
    d = self.data_config
    records = self._records(split)
    if self.transform is not None:  # lm texts, or the distinct sources (words) in split order
      texts = [r[0] for r in records]
      texts = texts if self.kind == "lm" else list(dict.fromkeys(texts))
      mlm = d.objective == "mlm"
      return labels.objective_examples(texts, self.source_tokenizer,
                                       d.max_source_len - (0 if mlm else 1), self.kind == "lm",
                                       mlm, too_long)
    if self.head in ("classify", "tag"):
      return labels.head_examples(records, self.source_tokenizer, self.target_tokenizer,
                                  d.max_source_len, too_long, self.head)
    if self.kind == "lm":
      ex = pipeline.encode_stream([r[0] for r in records], self.target_tokenizer, d.max_target_len)
      return ex, {"examples": len(ex), "dropped": 0, "truncated": 0}
    return pipeline.encode_pairs(records, self.source_tokenizer, self.target_tokenizer,
                                 d.max_source_len, d.max_target_len, too_long,
                                 self.arch == "decoder_only")

  def train_iterator(self) -> pipeline.BatchIterator:
    """This host's endless, checkpointable iterator of training batches."""
    d = self.data_config
    ex, counts = self._examples(d.train_split, d.too_long)
    ex = labels.subset(ex, d.label_fraction)
    self.stats["train"] = counts | {"used": len(ex)}
    if counts["dropped"] or counts["truncated"]:
      logging.info("%s %s: %d examples longer than data.max_*_len %s, %d truncated.",
                   self.dataset.name, d.train_split, counts["dropped"],
                   "dropped" if d.too_long == "drop" else "", counts["truncated"])
    if not len(ex):  # pylint: disable=g-explicit-length-test  (Examples has no __bool__)
      raise ConfigError(
          f"data.max_source_len={d.max_source_len}, data.max_target_len={d.max_target_len} with "
          f"data.too_long={d.too_long!r}: no training example of {self.dataset.name} "
          f"{d.train_split} is left ({counts['dropped']} dropped as too long, of "
          f"{counts['examples'] + counts['dropped']}); raise the lengths or use 'truncate'")
    mode = "pad" if self.kind == "lm" else d.batching  # lm rows are already full
    return iter(pipeline.BatchDataset(
        ex, rows=d.batch_size // self.process_count, row_len=self.row_len, mode=mode,
        seed=d.shuffle_seed, host=self.process_index, hosts=self.process_count,
        transform=self.transform))

  def eval_batches(self, split: str, batch_size: int | None = None
                   ) -> Iterator[dict[str, np.ndarray]]:
    """This host's padded batches of the whole split (over-long examples truncated, never
    dropped); every host gets the same number of batches; padding rows have weight 0."""
    global_rows = batch_size or self.eval_batch_size
    if global_rows % self.process_count:
      raise ValueError(f"eval batch size {global_rows} is not divisible by the "
                       f"{self.process_count} hosts")
    rows = global_rows // self.process_count
    ex, _ = self._examples(split, "truncate")
    per_host = math.ceil(len(ex) / self.process_count)
    ex = ex.shard(self.process_index, self.process_count)
    return pipeline.eval_batches(ex, rows, self.row_len, math.ceil(per_host / rows),
                                 self.transform)

  def encode_source(self, text: str) -> list[int]:
    """Encoder input (encoder-decoder) or prompt (decoder-only) ids of a source text, as in the
    batches: source ids + EOS, truncated to data.max_source_len. LM tasks: the ids, no EOS."""
    if self.kind == "lm":
      return self.target_tokenizer.encode(text)
    ids = self.source_tokenizer.encode(text)
    return pipeline.fit_length(ids, self.data_config.max_source_len, "truncate")

  def eval_examples(self, split: str) -> list[dict[str, Any]]:
    """Seq2seq: one dict per distinct source, {'source', 'references': all its targets}, in
    split order (all hosts get the whole list). LM tasks: []."""
    if not self.decodes:
      return []
    grouped: dict[str, dict[str, None]] = {}  # source -> its distinct targets, in order
    for source, target in self._records(split):
      grouped.setdefault(source, {})[target] = None
    return [{"source": s, "references": list(r)} for s, r in grouped.items()]


def load_task(cfg: Any, workdir: str | None = None, *, process_index: int | None = None,
              process_count: int | None = None) -> Task:
  """Prepares the data of `cfg.data` (offline, first use) and returns its Task; with a workdir,
  tokenizers are read from / written to workdir/tokenizers/{source,target}. An image model
  (model.image_size > 0) gets an images.ImageTask."""
  if cfg.model.image_size:
    return images.ImageTask(cfg, workdir, process_index=process_index,
                            process_count=process_count)
  return Task(cfg, workdir, process_index=process_index, process_count=process_count)


def copy_tokenizers(src_workdir: str, dst_workdir: str, only_source: bool = False,
                    also_target: bool = False) -> None:
  """Copies a run's tokenizers to another workdir (fine-tuning from it); `only_source`: just the
  one its encoder read, as `source` (and as `target` with `also_target`: masked LM predicts it)."""
  sides = files.listdir(os.path.join(src_workdir, "tokenizers"))
  if only_source:
    read = "source" if "source" in sides else "target"
    sides = [(read, "source")] + ([(read, "target")] if also_target else [])
  for side, to in sides if only_source else [(s, s) for s in sides]:
    tok = tokenizers.load(os.path.join(src_workdir, "tokenizers", side))
    tok.save(os.path.join(dst_workdir, "tokenizers", to))
