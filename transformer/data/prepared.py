"""Prepared array_record data read back: its records' digest, a corrupt file as one OSError
naming it and how to prepare it again (for builders.py's sources and provenance's digest)."""

import contextlib
import errno
import hashlib
import os
from collections.abc import Iterator, Sequence
from typing import Any


def prepared_records_sha256(paths: Sequence[str], chunk: int = 10_000) -> tuple[int, str]:
  """(records, sha256) of the records in prepared array_record shard files, in order, each
  tf.Example re-serialized deterministically: protobuf (upb) writes a feature map in an order
  that varies from process to process, so the files' bytes are not a function of the records."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  from tensorflow_datasets.proto import tf_example_pb2  # pylint: disable=g-import-not-at-top
  digest, count = hashlib.sha256(), 0
  for path in paths:
    with corrupt_data_errors(str(path)):  # a corrupt file raises when opened, read or closed
      reader = array_record_module.ArrayRecordReader(str(path))
      try:
        n = reader.num_records()
        for start in range(0, n, chunk):
          for raw in reader.read(start, min(start + chunk, n)):
            digest.update(tf_example_pb2.Example.FromString(raw).SerializeToString(
                deterministic=True))
        count += n
      finally:
        reader.close()
  return count, digest.hexdigest()


@contextlib.contextmanager
def corrupt_data_errors(path: str) -> Iterator[None]:
  """Raises array_record's (Riegeli's) error on a corrupt prepared file as an OSError naming
  `path` and how to prepare it again; any other RuntimeError as it is."""
  try:
    yield
  except RuntimeError as e:
    text = (str(e).strip().splitlines() or [""])[0]
    if "Riegeli" not in text and "array_record" not in text.lower():
      raise
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    raise OSError(errno.EIO, f"corrupt prepared data ({text[:160]}); delete {directory} and "
                  "rerun to prepare it again (a TFDS catalog dataset: build it again)",
                  path) from e


class CheckedSource:
  """A TFDS data source whose read errors on corrupt files become corrupt_data_errors'."""

  def __init__(self, source: Any, root: str):
    self._source, self._root = source, root
    if hasattr(source, "__getitems__"):
      self.__getitems__ = self._getitems

  def __len__(self) -> int:
    return len(self._source)

  def __iter__(self) -> Iterator[Any]:
    return (self[i] for i in range(len(self)))

  def __getitem__(self, index: Any) -> Any:
    with corrupt_data_errors(self._root):
      return self._source[index]

  def _getitems(self, indices: Sequence[int]) -> Any:
    with corrupt_data_errors(self._root):
      return self._source.__getitems__(indices)

  def __getattr__(self, name: str) -> Any:
    return getattr(self._source, name)
