"""Image classification data (transformer/data/images.py): the digits split is pinned and
stratified, augmentation is what a NumPy loop of pad-and-slice and mirror gives and is the same
on resume, batches have the model's shapes, a TFDS image builder (mocked) is read, and bad
names are one-line errors."""

import dataclasses

import numpy as np
import pytest
import tensorflow_datasets as tfds

from configs import vit
from transformer.config import from_configdict
from transformer.data import images, load_task, tokenizers
from transformer.data.tokenizers import NUM_SPECIAL

# sha256 of each split's example ids (int64): the split must never move.
DIGESTS = {
    "train": "b956cdbdccd5cb3bd48d7a7132008d96130ea4bea8628bef0faf139c25c30c7a",
    "validation": "547d5cc9b5b8100f8a377e07a8d52965c55928c9319f440dfa55f69f9b69fab9",
    "test": "a90dd2b22ca7a100839843b87bdd0403aff681f1a0fde4dc08ed28f1d65abaf4",
}


def _cfg(**data):
  c = vit.get_config("tiny")
  c.data.update(batch_size=16, **data)
  return from_configdict(c)


def test_digits_split_is_pinned_stratified_and_disjoint():
  data = images._digits()  # pylint: disable=protected-access
  assert {s: len(i) for s, i in data.ids.items()} == images.SPLIT_SIZES
  assert {s: images.ids_digest(i) for s, i in data.ids.items()} == DIGESTS
  every = np.concatenate(list(data.ids.values()))
  assert sorted(every.tolist()) == list(range(1797))  # disjoint, and all of them
  counts = {s: np.bincount(y, minlength=10) for s, (_, y) in data.splits.items()}
  total = sum(counts.values())
  for split, fraction in images.SPLIT_FRACTIONS.items():  # each class in proportion, +-1
    assert np.all(np.abs(counts[split] - fraction * total) <= 1), split
  x, _ = data.splits["train"]
  assert x.shape == (1259, 8, 8, 1) and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 1


def _naive_augment(pixels, draws, pad, flip):
  out = []
  for x, g in zip(pixels, draws):
    if pad:
      dy, dx = g.integers(0, 2 * pad + 1, size=2)
      padded = np.zeros((x.shape[0] + 2 * pad, x.shape[1] + 2 * pad, x.shape[2]), x.dtype)
      padded[pad:pad + x.shape[0], pad:pad + x.shape[1]] = x
      x = padded[dy:dy + x.shape[0], dx:dx + x.shape[1]]
    if flip and g.random() < 0.5:
      x = x[:, ::-1]
    out.append(x)
  return np.stack(out)


@pytest.mark.parametrize("pad,flip", [(1, False), (2, True), (0, True)])
def test_augment_is_a_padded_crop_and_a_mirror(pad, flip):
  pixels = np.random.default_rng(0).random((6, 5, 7, 2)).astype(np.float32)
  draws = lambda: [np.random.default_rng([3, i]) for i in range(6)]  # noqa: E731
  got = images.augment(pixels, draws(), pad, flip)
  np.testing.assert_array_equal(got, _naive_augment(pixels, draws(), pad, flip))
  assert got.shape == pixels.shape


def test_training_batches_have_the_model_shapes_and_resume_exactly():
  task = load_task(_cfg(crop_padding=1, flip=True), process_index=0, process_count=1)
  it = task.train_iterator()
  first = next(it)
  assert first["images"].shape == (16, 8, 8, 1) and first["images"].dtype == np.float32
  assert first["targets"].shape == (16, 1) and first["weights"].shape == (16, 1)
  assert -1 <= first["images"].min() and first["images"].max() <= 1
  assert set(np.unique(first["targets"])) <= set(range(NUM_SPECIAL, NUM_SPECIAL + 10))
  state = it.get_state()
  rest = [next(it) for _ in range(3)]
  again = load_task(_cfg(crop_padding=1, flip=True), process_index=0,
                    process_count=1).train_iterator()
  again.set_state(state)
  for a, b in zip(rest, [next(again) for _ in range(3)]):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  plain = load_task(_cfg(crop_padding=0, flip=False), process_index=0,
                    process_count=1).train_iterator()
  unaugmented = next(plain)
  np.testing.assert_array_equal(unaugmented["targets"], first["targets"])  # the same order
  assert not np.array_equal(unaugmented["images"], first["images"])


def test_eval_batches_cover_the_split_once_in_order():
  task = load_task(_cfg(), process_index=0, process_count=1)
  batches = list(task.eval_batches("validation", batch_size=64))
  pixels, labels = task.split("validation")
  targets = np.concatenate([b["targets"][:, 0] for b in batches])
  weights = np.concatenate([b["weights"][:, 0] for b in batches])
  assert len(targets) == 192 and weights.sum() == 179
  np.testing.assert_array_equal(targets[:179], labels + NUM_SPECIAL)
  np.testing.assert_allclose(batches[0]["images"][:64], images.normalize(pixels[:64]))


def test_mocked_tfds_image_builder_is_read(tmp_path):
  c = vit.get_config("tiny")
  c.model.update(image_size=28, patch_size=7)
  c.data.update(dataset="mnist", eval_split="test", batch_size=4, data_dir=str(tmp_path))
  with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
    task = load_task(from_configdict(c), str(tmp_path / "run"), process_index=0, process_count=1)
    batch = next(task.train_iterator())
  assert batch["images"].shape == (4, 28, 28, 1)
  assert task.class_names == [str(i) for i in range(10)]
  assert (tmp_path / "run" / "tokenizers" / "target" / "tokenizer.json").exists()


@pytest.mark.parametrize("overrides,message", [
    (dict(dataset="no_such_images"), "data.dataset='no_such_images' is neither 'digits' nor a "
     "TFDS image dataset"),
    (dict(image_size=4), r"has images of shape \(8, 8, 1\) \(H, W, C\); set model.image_size=8"),
])
def test_bad_dataset_is_a_one_line_error(overrides, message):
  c = vit.get_config("tiny")
  if "image_size" in overrides:
    c.model.update(**overrides)
  else:
    c.data.update(**overrides)
  with pytest.raises(ValueError, match=message) as e:
    load_task(from_configdict(c), process_index=0, process_count=1)
  assert "\n" not in str(e.value)


def test_a_run_made_for_other_classes_is_refused(tmp_path):
  """A workdir whose saved labels are not the data set's classes (a converted classifier of other
  classes, evaluated on the digits) is a one-line error, not class k scored against digit k."""
  workdir = str(tmp_path / "run")
  tokenizers.SymbolTokenizer(tuple("abcdefghij")).save(f"{workdir}/tokenizers/target")
  with pytest.raises(ValueError, match="has the classes 0, 1, 2, 3, 4, ... but this run's labels "
                                       "are a, b, c, d, e"):
    load_task(_cfg(), workdir, process_index=0, process_count=1)
  assert load_task(_cfg(), str(tmp_path / "fresh"), process_index=0, process_count=1)


def test_image_task_has_no_text_interface():
  task = load_task(_cfg(), process_index=0, process_count=1)
  assert task.eval_examples("test") == [] and not task.decodes and task.kind == "image"
  assert dataclasses.is_dataclass(task.data)


@pytest.mark.parametrize("pixels,message", [
    (np.full((2, 8, 8, 1), 255.0), r"images: pixels of float64 must be in \[0, 1\] \(or uint8 in "
     r"\[0, 255\]\), these span \[255, 255\]; divide by 255, or pass uint8"),
    (np.full((8, 8, 1), 255, np.int64), r"pixels of int64 must be in \[0, 1\]"),
    (np.full((8, 8, 1), 4000, np.uint16),
     r"pixels of uint16 must be in \[0, 1\].*span \[4000, 4000\]$"),
    (np.where(np.eye(8)[..., None] > 0, np.nan, 0.5), r"images: pixels hold NaN or infinities"),
    (np.full((8, 8, 1), -0.5, np.float32), r"span \[-0.5, -0.5\]; divide by 255"),
    (np.zeros((8, 8, 3), np.uint8), r"images of shape \(8, 8, 3\): this run takes an image "
     r"\(8, 8, 1\)"),
    ([np.zeros((8, 8, 1)), np.zeros((9, 8, 1))], r"^images of different shapes: this run takes"),
])
def test_pixels_out_of_their_documented_range_are_refused(pixels, message):
  """A ViT run's classify() takes floats in [0, 1] or uint8: a float image in [0, 255], other
  integer pixels, NaN or negative values, other channels or images of different shapes are one
  ValueError, never silently scaled wrong."""
  import types  # pylint: disable=g-import-not-at-top
  from transformer.infer import api  # pylint: disable=g-import-not-at-top
  run = types.SimpleNamespace(config=from_configdict(vit.get_config()))
  with pytest.raises(ValueError, match=message):
    api.Run.image_inputs(run, pixels)
  ok = api.Run.image_inputs(run, np.full((8, 8, 1), 255, np.uint8))
  np.testing.assert_allclose(ok, 1.0)
  np.testing.assert_allclose(api.Run.image_inputs(run, np.full((8, 8), 0.25)), -0.5)
