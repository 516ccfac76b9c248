"""benchmarks/input_pipeline.py's batch digest, which `--compare` prints as "the same batches" or
"DIFFERENT batches": docs/performance.md's packing speedups rest on it saying the same only for
the same data. Checked on hand-made batches and on the real G2P pipeline (g2p_mini's CMUdict
files)."""

import numpy as np

import g2p_mini
from bench_loader import load_benchmark
from transformer.config import from_configdict

input_pipeline = load_benchmark("input_pipeline")


def _batches(seed: int = 0) -> list[dict]:
  rng = np.random.default_rng(seed)
  return [{"inputs": rng.integers(0, 9, (4, 6), dtype=np.int32),
           "targets": rng.integers(0, 9, (4, 5), dtype=np.int32)} for _ in range(3)]


def test_digest_is_equal_only_for_the_same_batches():
  """Equal for equal contents (fresh arrays, keys in another order); different after one value,
  a dtype, a shape with the same bytes, a swapped batch order or a renamed key."""
  digest = input_pipeline.batch_digest
  base = digest(_batches())
  assert digest([dict(reversed(list(b.items()))) for b in _batches()]) == base
  changed = _batches()
  changed[2]["targets"][3, 4] += 1
  retyped = [b | {"inputs": b["inputs"].astype(np.uint32)} for b in _batches()]
  reshaped = [b | {"inputs": b["inputs"].reshape(6, 4)} for b in _batches()]
  renamed = [{"sources": b["inputs"], "targets": b["targets"]} for b in _batches()]
  others = [changed, retyped, reshaped, _batches()[::-1], renamed, _batches()[:2], _batches(1)]
  digests = [digest(o) for o in others]
  assert base not in digests and len(set(digests)) == len(digests)


def test_pipeline_runs_give_one_digest_per_data_order(tmp_path):
  """Two runs of the packed pipeline on one config give the same digest (the pipeline is
  deterministic), and another shuffle seed gives another one: the digest sees the data order."""
  cd = g2p_mini.config(str(tmp_path))
  first = input_pipeline.run(from_configdict(cd), "pack", 4)
  again = input_pipeline.run(from_configdict(cd), "pack", 4)
  cd.data.shuffle_seed += 1
  reshuffled = input_pipeline.run(from_configdict(cd), "pack", 4)
  assert first["digest"] == again["digest"] != reshuffled["digest"]
  assert 0.5 < first["both_fill"] <= 1.0 and first["batches_per_s"] > 0
