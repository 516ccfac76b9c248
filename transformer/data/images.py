"""Image classification data for a Vision Transformer (model.image_size > 0), read through Grain.

`data.dataset` is `digits` (scikit-learn's 8x8 handwritten digits, 1,797 images shipped with the
package: offline, split here into SPLIT_SIZES by a pinned stratified draw) or a TFDS image builder
(mnist, cifar10, ...) prepared as array_record in data.data_dir, read with `tfds.data_source`
(never downloaded). Pixels are scaled to [0, 1] (the dataset's range: 16 for digits, 255 for
uint8 images), augmented (training only: a random crop of the image padded by data.crop_padding
zero pixels, a horizontal flip with data.flip), then normalised to [-1, 1] as Hugging Face's ViT
image processor does. Each augmentation draw is seeded by (seed, data.shuffle_seed, epoch,
example), so a resumed run repeats it. A batch: `images` float32 [rows, H, W, C], `targets` int32
[rows, 1] (the label tokenizer's id of the class; 0 on padding rows), `weights` float32 [rows, 1].
"""

import dataclasses
import hashlib
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import grain
import numpy as np

from transformer import files
from transformer.data import tokenizers
from transformer.data.stream import Stream

DIGITS = "digits"
SPLIT_SEED = 20260531  # the pinned draw of the digits split
SPLIT_FRACTIONS = {"validation": 0.1, "test": 0.2}  # per class; the rest is train
SPLIT_SIZES = {"train": 1259, "validation": 179, "test": 359}  # what the fractions give
AUGMENT_SALT = 7  # keeps the augmentation draws apart from other uses of the same seeds


@dataclasses.dataclass(frozen=True)
class ImageData:
  """Every split of an image dataset: pixels in [0, 1] float32 [n, H, W, C], labels int64 [n],
  the class names (label i is class_names[i]) and each split's example ids (digest)."""
  name: str
  splits: dict[str, tuple[np.ndarray, np.ndarray]]
  class_names: tuple[str, ...]
  ids: dict[str, np.ndarray]


def digits_split(labels: np.ndarray, seed: int = SPLIT_SEED) -> dict[str, np.ndarray]:
  """The pinned stratified split of the digits: per class, a seeded permutation of its example
  ids gives round(fraction * count) to validation, then test, the rest to train; ids sorted."""
  out = {name: [] for name in ("train", *SPLIT_FRACTIONS)}
  for c in np.unique(labels):
    ids = np.random.default_rng([seed, int(c)]).permutation(np.flatnonzero(labels == c))
    start = 0
    for name, fraction in SPLIT_FRACTIONS.items():
      n = round(fraction * len(ids))
      out[name].append(ids[start:start + n])
      start += n
    out["train"].append(ids[start:])
  return {name: np.sort(np.concatenate(parts)) for name, parts in out.items()}


def ids_digest(ids: np.ndarray) -> str:
  """The sha256 of a split's example ids (int64, in order): what pins a split."""
  return hashlib.sha256(np.asarray(ids, np.int64).tobytes()).hexdigest()


def _digits() -> ImageData:
  """scikit-learn's digits: 8x8 one-channel images of 0-16, split by digits_split."""
  from sklearn import datasets  # pylint: disable=g-import-not-at-top  (only for this dataset)
  bunch = datasets.load_digits()
  pixels = (np.asarray(bunch.images, np.float32) / 16.0)[..., None]
  labels = np.asarray(bunch.target, np.int64)
  ids = digits_split(labels)
  return ImageData(DIGITS, {s: (pixels[i], labels[i]) for s, i in ids.items()},
                   tuple(str(n) for n in bunch.target_names), ids)


def _tfds_split(name: str, split: str, data_dir: str, image_key: str, label_key: str
                ) -> tuple[np.ndarray, np.ndarray]:
  """A prepared TFDS split as (pixels in [0, 1], labels)."""
  from transformer.data import builders  # pylint: disable=g-import-not-at-top  (TFDS is slow)
  source = builders.catalog_source(name, split, data_dir)
  records = list(builders.records(source))
  images = np.stack([np.asarray(r[image_key]) for r in records])
  if images.ndim == 3:  # [n, H, W]: one channel
    images = images[..., None]
  labels = np.asarray([int(r[label_key]) for r in records], np.int64)
  return to_unit_range(images, f"{name} {split} {image_key}"), labels


def _tfds(d: Any, data_dir: str) -> ImageData:
  """A TFDS image builder's splits (data.train_split, data.eval_split and test, where present)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top  (TFDS is slow)
  try:
    builder = tfds.builder(d.dataset, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise ValueError(f"data.dataset={d.dataset!r} is neither {DIGITS!r} nor a TFDS image "
                     "dataset") from None
  image_key, label_key = d.source_key or "image", d.target_key or "label"
  features = builder.info.features
  for key, value in (("source_key", image_key), ("target_key", label_key)):
    if value not in features:
      raise ValueError(f"data.{key}={value!r} is not a feature of {d.dataset} "
                       f"({', '.join(sorted(features))})")
  names = getattr(features[label_key], "names", None) or [
      str(i) for i in range(features[label_key].num_classes)]
  wanted = dict.fromkeys((d.train_split, d.eval_split, "test"))
  available = set(builder.info.splits.keys()) or set(wanted)
  splits = {s: _tfds_split(d.dataset, s, data_dir, image_key, label_key)
            for s in wanted if s in available}
  ids = {s: np.arange(len(labels)) for s, (_, labels) in splits.items()}
  return ImageData(d.dataset, splits, tuple(n.replace(" ", "_") for n in names), ids)


def load_images(d: Any) -> ImageData:
  """The image dataset of data config `d` (cfg.data); a bad name is a one-line ValueError."""
  if d.dataset == DIGITS:
    return _digits()
  data_dir = os.path.expanduser(d.data_dir) if d.data_dir else (
      os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets"))
  return _tfds(d, data_dir)


def augment(pixels: np.ndarray, draws: Sequence[np.random.Generator], crop_padding: int,
            flip: bool) -> np.ndarray:
  """pixels [n, H, W, C] in [0, 1]: each a random HxW crop of itself padded by crop_padding zero
  pixels each side, then mirrored left-right with probability 1/2 if `flip`; draw i decides
  image i (crop rows, crop columns, then the flip)."""
  n, h, w, _ = pixels.shape
  p = crop_padding
  out = pixels
  if p:
    padded = np.pad(pixels, ((0, 0), (p, p), (p, p), (0, 0)))
    offsets = np.array([g.integers(0, 2 * p + 1, size=2) for g in draws]).reshape(n, 2)
    rows = offsets[:, :1] + np.arange(h)  # [n, H]
    cols = offsets[:, 1:] + np.arange(w)  # [n, W]
    out = padded[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]
  if flip:
    mirrored = np.array([g.random() < 0.5 for g in draws], bool).reshape(n)
    out = np.where(mirrored[:, None, None, None], out[:, :, ::-1], out)
  return out


def to_unit_range(images: np.ndarray, where: str) -> np.ndarray:
  """Pixels as documented (uint8 in [0, 255], any other number type in [0, 1]) as float32 in
  [0, 1]; raises ValueError naming `where` for NaN, infinities or values out of that range (a
  float image in [0, 255], uint16 or int pixels that are not uint8)."""
  array = np.asarray(images)
  if array.dtype == np.uint8:
    return array.astype(np.float32) / 255.0
  array = array.astype(np.float32)
  if not np.isfinite(array).all():
    raise ValueError(f"{where}: pixels hold NaN or infinities")
  if array.size and (array.min() < 0.0 or array.max() > 1.0):
    hint = "; divide by 255, or pass uint8" if array.max() <= 255.0 else ""
    raise ValueError(f"{where}: pixels of {np.asarray(images).dtype} must be in [0, 1] (or uint8 "
                     f"in [0, 255]), these span [{array.min():g}, {array.max():g}]{hint}")
  return array


def normalize(pixels: np.ndarray) -> np.ndarray:
  """Pixels in [0, 1] -> the model's input in [-1, 1] ((x - 0.5) / 0.5, as HF's ViT processor)."""
  return ((np.asarray(pixels, np.float32) - 0.5) / 0.5).astype(np.float32)


def _batch(pixels: np.ndarray, label_ids: np.ndarray, rows: int) -> dict[str, np.ndarray]:
  """A batch of `rows` rows: the examples first, then zero padding rows (target 0, weight 0)."""
  n = len(label_ids)
  images = np.zeros((rows,) + pixels.shape[1:], np.float32)
  images[:n] = normalize(pixels)
  targets = np.zeros((rows, 1), np.int32)
  targets[:n, 0] = label_ids
  return {"images": images, "targets": targets, "weights": (targets != 0).astype(np.float32)}


class ImageBatches(grain.IterDataset):
  """Endless augmented training batches of host `host` of `hosts` (`rows` per batch)."""

  def __init__(self, pixels: np.ndarray, label_ids: np.ndarray, *, rows: int,
               seeds: tuple[int, ...], crop_padding: int = 0, flip: bool = False, host: int = 0,
               hosts: int = 1):
    super().__init__()
    self.pixels, self.label_ids, self.rows, self.seeds = pixels, label_ids, rows, seeds
    self.crop_padding, self.flip, self.host, self.hosts = crop_padding, flip, host, hosts
    Stream(len(label_ids), seeds[-1], host, hosts)  # fails now if there are fewer than hosts

  def __iter__(self) -> "ImageBatchIterator":
    return ImageBatchIterator(self)

  def __str__(self) -> str:
    return f"ImageBatches(rows={self.rows}, crop_padding={self.crop_padding}, flip={self.flip})"


class ImageBatchIterator(grain.DatasetIterator):
  """State: {'pos': stream position, 'rows', 'host', 'hosts'}; the order is stream.py's epochs
  shuffled by data.shuffle_seed, the augmentation drawn per (seeds, epoch, example)."""

  def __init__(self, ds: ImageBatches):
    super().__init__()
    self._ds, self._pos = ds, 0
    self._stream = Stream(len(ds.label_ids), ds.seeds[-1], ds.host, ds.hosts)

  def __next__(self) -> dict[str, np.ndarray]:
    ds = self._ds
    positions = np.arange(self._pos, self._pos + ds.rows)
    self._pos += ds.rows
    idx = self._stream.ids(positions)
    epochs = self._stream.locate(positions)[0]
    pixels = ds.pixels[idx]
    if ds.crop_padding or ds.flip:
      draws = [np.random.default_rng([*ds.seeds, AUGMENT_SALT, int(e), int(i)])
               for e, i in zip(epochs, idx)]
      pixels = augment(pixels, draws, ds.crop_padding, ds.flip)
    return _batch(pixels, ds.label_ids[idx], ds.rows)

  def get_state(self) -> dict[str, Any]:
    ds = self._ds
    return {"pos": int(self._pos), "rows": ds.rows, "host": ds.host, "hosts": ds.hosts}

  def set_state(self, state: dict[str, Any]) -> None:
    ds = self._ds
    saved = (int(state.get("host", -1)), int(state.get("hosts", -1)))
    if saved != (ds.host, ds.hosts) or int(state.get("rows", -1)) != ds.rows:
      raise ValueError(f"the image iterator state of host {saved[0]} of {saved[1]} with "
                       f"{state.get('rows')} rows cannot resume host {ds.host} of {ds.hosts} with "
                       f"{ds.rows} rows (images resume on the same hosts and data.batch_size)")
    self._pos = int(state["pos"])


class ImageTask:
  """An image classification dataset behind the interface of transformer.data.task.Task."""

  kind = "image"
  decodes = False
  source_tokenizer = None
  transform = extra_ids = dataset = None  # no objective; no prepared files to fingerprint

  def __init__(self, cfg: Any, workdir: str | None = None, *, process_index: int | None = None,
               process_count: int | None = None):
    d, m = cfg.data, cfg.model
    if process_index is None or process_count is None:
      import jax  # pylint: disable=g-import-not-at-top  (only when the caller gives no host)
      process_index, process_count = jax.process_index(), jax.process_count()
    self.data_config, self.arch, self.head, self.seed = d, m.arch, m.head, cfg.seed
    if d.batch_size % process_count:
      raise ValueError(f"data.batch_size={d.batch_size} is not divisible by the "
                       f"{process_count} hosts")
    self.process_index, self.process_count = process_index, process_count
    self.eval_batch_size = getattr(cfg.eval, "batch_size", 0) or d.batch_size
    self.stats: dict[str, Any] = {}
    saved = os.path.join(workdir, "tokenizers", "target") if workdir else None
    has_saved = saved is not None and files.exists(os.path.join(saved, "tokenizer.json"))
    self.data = None
    if not d.dataset:  # a converted model without data: its workdir's label tokenizer
      if not has_saved:
        raise ValueError("data.dataset is unset: a model without data needs its workdir")
      self.target_tokenizer = tokenizers.load(saved)
      return
    self.data = load_images(d)
    shape = (m.image_size, m.image_size, m.image_channels)
    first = next(iter(self.data.splits.values()))[0]
    if first.shape[1:] != shape:
      raise ValueError(f"data.dataset={d.dataset!r} has images of shape {first.shape[1:]} (H, W, "
                       f"C); set model.image_size={first.shape[1]} and "
                       f"model.image_channels={first.shape[3]} (the model takes {shape})")
    self.target_tokenizer = (tokenizers.load(saved) if has_saved
                             else tokenizers.SymbolTokenizer(self.data.class_names))
    if saved and not has_saved:
      self.target_tokenizer.save(saved)
    if list(self.target_tokenizer.units) != list(self.data.class_names):  # label i is id 4 + i
      raise ValueError(f"data.dataset={d.dataset!r} has the classes "
                       f"{', '.join(self.data.class_names[:5])}, ... but this run's labels are "
                       f"{', '.join(list(self.target_tokenizer.units)[:5])}, ...: evaluate or "
                       f"train it on the data set it was made for")

  @property
  def class_names(self) -> list[str]:
    """The class names in label order (the label tokenizer's units)."""
    return list(self.target_tokenizer.units)

  def split(self, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(pixels in [0, 1] [n, H, W, C], class indices [n]) of `split`."""
    if self.data is None:
      raise ValueError(f"data.dataset is unset: this workdir holds a model without data (split "
                       f"{split!r})")
    if split not in self.data.splits:
      raise ValueError(f"split {split!r} of {self.data.name} does not exist; it has "
                       f"{', '.join(self.data.splits)}")
    return self.data.splits[split]

  def label_ids(self, labels: np.ndarray) -> np.ndarray:
    """The label tokenizer's ids of class indices."""
    return np.asarray(labels, np.int64) + tokenizers.NUM_SPECIAL

  def train_iterator(self) -> ImageBatchIterator:
    """This host's endless, checkpointable iterator of augmented training batches."""
    d = self.data_config
    pixels, labels = self.split(d.train_split)
    self.stats["train"] = {"examples": len(labels), "dropped": 0, "truncated": 0,
                           "used": len(labels)}
    rows = d.batch_size // self.process_count
    return iter(ImageBatches(pixels, self.label_ids(labels), rows=rows,
                             seeds=(self.seed, d.shuffle_seed), crop_padding=d.crop_padding,
                             flip=d.flip, host=self.process_index, hosts=self.process_count))

  def eval_batches(self, split: str, batch_size: int | None = None
                   ) -> Iterator[dict[str, np.ndarray]]:
    """This host's batches of the whole split in order, unaugmented; every host gets the same
    number of batches; padding rows have weight 0."""
    global_rows = batch_size or self.eval_batch_size
    if global_rows % self.process_count:
      raise ValueError(f"eval batch size {global_rows} is not divisible by the "
                       f"{self.process_count} hosts")
    rows = global_rows // self.process_count
    pixels, labels = self.split(split)
    mine = np.arange(self.process_index, len(labels), self.process_count)
    num_batches = math.ceil(math.ceil(len(labels) / self.process_count) / rows)
    for b in range(num_batches):
      idx = mine[b * rows:(b + 1) * rows]
      yield _batch(pixels[idx], self.label_ids(labels[idx]), rows)

  def eval_examples(self, split: str) -> list[dict[str, Any]]:
    """No decoded examples: an image task's metrics are teacher-forced."""
    del split
    return []
