"""TFDS builders (`text_files`, `tsv_pairs`; `cmudict_g2p` in cmudict.py) and `open_dataset`,
which gives a `Dataset` of array_record sources per split (read without TensorFlow). Local
builders are prepared offline on first use into `data.data_dir`, one process at a time (a second
process opening the same data waits for the first and reads what it prepared); catalog datasets
(`lm1b`, `wmt14_translate/de-en`, ...) must already be prepared there.
"""

import contextlib
import dataclasses
import fcntl
import glob
import hashlib
import importlib
import io
import json
import os
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow_datasets as tfds

from transformer.data import cmudict, prepared

SPLITS = ("train", "validation", "test")
# Without data.dev_file, validation is bucket 0 of 20 of data.train_file's sources (words) under
# this salt; CARVE_ID is part of the prepared data's name, as changing it changes the split.
CARVE_SALT, CARVE_BUCKETS = "tsv_pairs/validation/v1:", 20
CARVE_ID = f"validation carved: {CARVE_SALT} 1/{CARVE_BUCKETS}"


def _files_fingerprint(paths: Sequence[str], *extra: Any) -> str:
  """A short name identifying local input files (path, size, mtime) and options."""
  stats = [(os.path.abspath(p), os.path.getsize(p), int(os.path.getmtime(p))) for p in paths]
  return "f" + hashlib.sha256(json.dumps([stats, extra]).encode()).hexdigest()[:16]


@dataclasses.dataclass(eq=False)
class TextFilesConfig(tfds.core.BuilderConfig):
  """Which local text files, and how they are split."""
  files: tuple[str, ...] = ()
  text_split: str = "fraction"
  train_fraction: float = 0.9


class TextFiles(tfds.core.GeneratorBasedBuilder):
  """Language modelling over local text files; one record per document (file) per split.
  `fraction`: the first `train_fraction` of the concatenated text's characters is `train`, the
  rest `validation` (nanoGPT's). `document`: the first round(n * train_fraction) files (sorted by
  path) are `train`, the others `validation`."""

  VERSION = tfds.core.Version("1.1.0")  # bumped as cmudict_g2p's is (see there): same rule
  RELEASE_NOTES = {"1.1.0": "Records stored in file order (disable_shuffling)."}

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(builder=self, description=self.__doc__, disable_shuffling=True,
                                 features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager
    c = self.builder_config
    texts = [read_text_file(path) for path in c.files]
    if not any(t.strip() for t in texts):
      raise ValueError(f"data.text_file: {', '.join(c.files)} holds no text")
    if c.text_split == "fraction":
      text = "".join(texts)
      cut = int(len(text) * c.train_fraction)
      parts = {"train": [text[:cut]], "validation": [text[cut:]]}
    else:
      if len(texts) < 2:
        raise ValueError(f"data.text_split='document' needs several files; data.text_file "
                         f"matched {len(texts)}")
      n = min(max(round(len(texts) * c.train_fraction), 1), len(texts) - 1)
      parts = {"train": texts[:n], "validation": texts[n:]}
    return {name: self._generate_examples(docs) for name, docs in parts.items()}

  def _generate_examples(self, docs: list[str]):
    for i, doc in enumerate(docs):
      yield f"{i:09d}", {"text": doc}


def read_text_file(path: str) -> str:
  """A UTF-8 text file's contents; a file that is not UTF-8 is a ValueError naming file:line."""
  with open(path, "rb") as f:
    data = f.read()
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise _not_utf8(path, data.count(b"\n", 0, e.start) + 1, data[e.start]) from None


def _not_utf8(path: str, line: int, byte: int) -> ValueError:
  return ValueError(f"{path}:{line}: not UTF-8 text (byte {byte:#04x}); is it a binary file?")


@dataclasses.dataclass(eq=False)
class TsvPairsConfig(tfds.core.BuilderConfig):
  """Local `source<TAB>target` files per split ("" = no such split); `carve_validation`: the
  validation split is the held-out words of the train file (see CARVE_SALT)."""
  files: tuple[tuple[str, str], ...] = ()  # (split, path)
  carve_validation: bool = False


def held_out(source: str) -> bool:
  """True for the sources (words) that a carved validation split takes from the train file."""
  return cmudict.hash_bucket(CARVE_SALT, source, CARVE_BUCKETS) == 0


class TsvPairs(tfds.core.GeneratorBasedBuilder):
  """Sequence-to-sequence pairs from local `source<TAB>target` files (e.g. a published G2P split);
  with `carve_validation`, `validation` is the train file's sources that `held_out` picks."""

  VERSION = tfds.core.Version("1.1.0")  # bumped as cmudict_g2p's is (see there): same rule
  RELEASE_NOTES = {"1.1.0": "Records stored in file order (disable_shuffling)."}

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description=self.__doc__, supervised_keys=("source", "target"),
        disable_shuffling=True, features=tfds.features.FeaturesDict(
            {"source": tfds.features.Text(), "target": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager
    c = self.builder_config
    out = {split: self._generate_examples(path) for split, path in c.files}
    if c.carve_validation:
      train = dict(c.files)["train"]
      out["train"] = self._generate_examples(train, lambda source: not held_out(source))
      out["validation"] = self._generate_examples(train, held_out)
    return out

  def _generate_examples(self, path: str, keep: Callable[[str], bool] | None = None):
    kept = 0
    for key, record in read_tsv_pairs(path):
      if keep is None or keep(record["source"]):
        kept += 1
        yield key, record
    if keep is held_out and not kept:
      raise ValueError(f"data.train_file={path!r}: too few words to carve a validation split "
                       f"from (1 in {CARVE_BUCKETS}); give data.dev_file")


def read_tsv_pairs(path: str):
  """Yields (key, {'source', 'target'}) from a `source<TAB>target` file; a bad line, a file that
  is not UTF-8 or holds no pair is a ValueError naming file:line."""
  found = False
  with open(path, "rb") as f:  # bytes: a decoding error can then name its line
    for n, raw in enumerate(f, 1):
      try:
        line = raw.decode("utf-8").rstrip("\n\r")
      except UnicodeDecodeError as e:
        raise _not_utf8(path, n, raw[e.start]) from None
      if not line.strip():
        continue
      source, sep, target = line.partition("\t")
      if not sep or not source.strip() or not target.strip():
        raise ValueError(f"{path}:{n}: expected 'source<TAB>target', got {line[:60]!r}")
      found = True
      yield f"{n:09d}", {"source": source.strip(), "target": target.strip()}
  if not found:
    raise ValueError(f"{path}: no 'source<TAB>target' lines (an empty file?)")


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A dataset resolved from the config: sources per split and what the features mean."""
  name: str  # TFDS name with config, e.g. 'cmudict_g2p/no_stress'
  kind: str  # 'seq2seq' | 'lm'
  source_key: str | None  # None for lm
  target_key: str
  root: str  # directory of the prepared data; tokenizers are saved under root/tokenizers
  splits: tuple[str, ...]
  _open: Callable[[str], Sequence[Any]] = dataclasses.field(repr=False, compare=False)

  def source(self, split: str) -> Sequence[Any]:
    """Random-access source of `split` (len, __getitem__); records are dicts of str/bytes.
    Corrupt prepared files are an OSError naming them (prepared.corrupt_data_errors)."""
    if split not in self.splits:
      raise ValueError(f"split {split!r} of {self.name} does not exist; it has "
                       f"{', '.join(self.splits)}")
    with prepared.corrupt_data_errors(self.root):
      return prepared.CheckedSource(self._open(split), self.root)


def _prepare(builder: tfds.core.DatasetBuilder) -> None:
  """Prepares a local builder offline (array_record) unless it is there, with one stderr line."""
  from tensorflow_datasets.core.utils import tqdm_utils  # pylint: disable=g-import-not-at-top
  if builder.is_prepared():
    return
  print(f"preparing {builder.info.full_name} in {builder.data_dir} (first use, offline) ...",
        file=sys.stderr, flush=True)
  shown = getattr(tqdm_utils, "_active", True)
  tfds.display_progress_bar(False)
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      builder.download_and_prepare(file_format="array_record")
  finally:
    tfds.display_progress_bar(shown)


@contextlib.contextmanager
def _preparation_lock(builder: tfds.core.DatasetBuilder, data_dir: str) -> Iterator[None]:
  """Holds `data_dir`/.<name>.lock for `builder`'s data with `fcntl.flock` (the kernel drops it
  when its process dies), waiting with one stderr line while another process holds it. A bucket
  data_dir is not locked."""
  if "://" in data_dir:
    yield
    return
  name = builder.info.full_name
  os.makedirs(data_dir, exist_ok=True)
  # Never deleted: a process waiting on a deleted file's lock would prepare beside a new holder.
  with open(os.path.join(data_dir, f".{name.replace('/', '_')}.lock"), "a") as lock:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      print(f"waiting for another process preparing {name} in {data_dir} ...", file=sys.stderr,
            flush=True)
      fcntl.flock(lock, fcntl.LOCK_EX)
    yield


_FILE_KEYS = dict(zip(SPLITS, ("train_file", "dev_file", "test_file")))


def _tsv_pairs_builder(d: Any, data_dir: str) -> tfds.core.DatasetBuilder:
  given = [(s, getattr(d, k)) for s, k in _FILE_KEYS.items() if getattr(d, k)]
  if not any(s == "train" for s, _ in given):
    raise ValueError(f"data.dataset={d.dataset!r} needs data.train_file (source<TAB>target)")
  for s, path in given:
    check_regular_file(path, _FILE_KEYS[s])
  carve = not d.dev_file
  extra = (given, CARVE_ID) if carve else (given,)  # carving changes the data: another name
  cfg = TsvPairsConfig(name=_files_fingerprint([p for _, p in given], *extra),
                       files=tuple(given), carve_validation=carve)
  return TsvPairs(config=cfg, data_dir=data_dir)


def _cmudict_builder(d: Any, data_dir: str) -> tfds.core.DatasetBuilder:
  """cmudict_g2p, or the split given in data.*_file (read as tsv_pairs)."""
  if any(getattr(d, k) for k in _FILE_KEYS.values()):
    return _tsv_pairs_builder(d, data_dir)
  return cmudict.CmudictG2p(config=d.dataset.partition("/")[2] or None, data_dir=data_dir)


def _text_files_builder(d: Any, data_dir: str) -> tfds.core.DatasetBuilder:
  if not d.text_file:
    raise ValueError("data.dataset='text_files' needs data.text_file (a path or a glob)")
  files = tuple(sorted(glob.glob(os.path.expanduser(d.text_file))))
  if not files:
    raise FileNotFoundError(f"data.text_file={d.text_file!r}: no such file")
  for path in files:
    check_regular_file(path, "text_file")
  cfg = TextFilesConfig(
      name=_files_fingerprint(files, d.text_split, d.train_fraction), files=files,
      text_split=d.text_split, train_fraction=d.train_fraction)
  return TextFiles(config=cfg, data_dir=data_dir)


# The local builders by name (data.dataset, before any "/config"): data config -> builder.
LOCAL_BUILDERS: dict[str, Callable[[Any, str], tfds.core.DatasetBuilder]] = {
    "cmudict_g2p": _cmudict_builder,
    "text_files": _text_files_builder,
    "tsv_pairs": _tsv_pairs_builder,
}


def check_regular_file(path: str, key: str) -> None:
  """Raises FileNotFoundError (`data.<key>=path` in one line) unless `path` is a regular file:
  reading a FIFO would wait for a writer forever, a device or a directory is no data file."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"data.{key}={path!r}: no such file")
  if not os.path.isfile(path):
    mode = os.stat(path).st_mode
    what = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a directory"
            if stat.S_ISDIR(mode) else "a device or socket")
    raise FileNotFoundError(f"data.{key}={path!r} is {what}, not a regular file; give a file")


def _catalog_builder(name: str, data_dir: str) -> tfds.core.DatasetBuilder:
  """A catalog builder by TFDS name (WMT builders live in a module TFDS does not import)."""
  base = name.split("/")[0]
  if base.startswith("wmt") and base.endswith("_translate"):
    importlib.import_module(f"tensorflow_datasets.translate.{base[:-len('_translate')]}")
  try:
    return tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise ValueError(f"data.dataset={name!r} is neither a TFDS catalog dataset nor one of "
                     f"{'|'.join(LOCAL_BUILDERS)}") from None


def catalog_source(name: str, split: str, data_dir: str) -> Sequence[Any]:
  """tfds.data_source without ever downloading; a missing dataset is a one-line error."""
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except Exception as e:  # pylint: disable=broad-except  (tfds raises many kinds)
    raise FileNotFoundError(
        f"data.dataset={name!r} split {split!r} is not prepared as array_record under "
        f"data.data_dir={data_dir!r}: on a machine with internet run `tfds build {name} "
        f"--file_format=array_record --data_dir=DIR`, copy DIR here and set data.data_dir=DIR "
        f"({type(e).__name__})") from None


def records(source: Sequence[Any], chunk: int = 8192) -> Iterator[Any]:
  """Every record of a data source in order, read `chunk` at a time (one read per chunk)."""
  getitems = getattr(source, "__getitems__", None)
  for start in range(0, len(source), chunk):
    indices = list(range(start, min(start + chunk, len(source))))
    try:
      chunk_records = getitems(indices) if getitems else [source[i] for i in indices]
    except TypeError:  # tfds.testing.mock_data sources lack a working __getitems__
      chunk_records = [source[i] for i in indices]
    yield from chunk_records


def open_dataset(d: Any) -> Dataset:
  """Resolves data config `d` (cfg.data) to a Dataset, preparing local builders on first use."""
  data_dir = os.path.expanduser(d.data_dir) if d.data_dir else (
      os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets"))
  base = d.dataset.split("/")[0]
  if base in LOCAL_BUILDERS:
    builder = LOCAL_BUILDERS[base](d, data_dir)
    if not builder.is_prepared():
      with _preparation_lock(builder, data_dir):
        # Built again: a builder made before another process prepared the data does not read it.
        builder = LOCAL_BUILDERS[base](d, data_dir)
        _prepare(builder)
    open_split = builder.as_data_source
    splits = tuple(builder.info.splits.keys())
  else:
    builder = _catalog_builder(d.dataset, data_dir)
    splits = tuple(builder.info.splits.keys()) or SPLITS  # unknown until prepared (or mocked)
    open_split = lambda split: catalog_source(d.dataset, split, data_dir)
  features = set(builder.info.features.keys())
  source_key, target_key = d.source_key or None, d.target_key or None
  if not target_key:
    supervised = builder.info.supervised_keys
    if supervised and isinstance(supervised, tuple) and len(supervised) == 2:
      source_key, target_key = source_key or supervised[0], supervised[1]
    elif "text" in features:
      target_key = "text"
    else:
      raise ValueError(f"data.target_key: say which feature of {d.dataset} to predict "
                       f"({', '.join(sorted(features))})")
  for key, value in (("source_key", source_key), ("target_key", target_key)):
    if value is not None and value not in features:
      raise ValueError(f"data.{key}={value!r} is not a feature of {d.dataset} "
                       f"({', '.join(sorted(features))})")
  return Dataset(name=builder.info.full_name.rsplit("/", 1)[0], kind="seq2seq" if source_key
                 else "lm", source_key=source_key, target_key=target_key,
                 root=str(builder.data_dir), splits=splits, _open=open_split)
