"""ViT patch size on the digits: 2x2-pixel patches (16 of them) vs 4x4 (4), seeds 0-2 each.

Smaller patches give a longer sequence for the same image (more compute per image). The study of
docs/vit.md runs it on configs/vit.py:tiny (benchmarks/vit_digits.py gives the exact command):

  python sweep.py --config=configs/vit.py:tiny --sweep=configs/sweeps/vit_patch.py \
      --workdir=runs/sweep_vit_patch --metric=test/accuracy
"""

from configs.sweeps import product, sweep


def get_sweep():
  """Six runs: `model.patch_size` 2 and 4, each with seeds 0, 1 and 2."""
  return product(sweep("model.patch_size", [2, 4]), sweep("seed", [0, 1, 2]))
