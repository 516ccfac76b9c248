"""The whole cmudict_g2p/no_stress data set, prepared once per pytest invocation.

`prepared_data_dir(tmp_path_factory)` returns a TFDS data_dir holding it (and the tokenizers
load_task keeps next to it), prepared (~15 s) by the first caller under a file lock in the
directory that every pytest-xdist worker shares, as g2p_mini.trained_run does; later callers, in
any worker, reuse it. Tests read it and never write into it.
"""

from __future__ import annotations

import fcntl
import os

from configs import base
from transformer.config import from_configdict
from transformer.data import load_task

# (words, (word, pronunciation) examples) of each split of cmudict_g2p per config, as the pinned
# cmudict release gives them.
COUNTS = {
    "no_stress": {"train": (106217, 113644), "validation": (6186, 6649), "test": (12523, 13374)},
    "stress": {"train": (106217, 113889), "validation": (6186, 6669), "test": (12523, 13413)},
}


def prepared_data_dir(tmp_path_factory) -> str:
  basetemp = tmp_path_factory.getbasetemp()
  shared = basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp
  root = shared / "cmudict_prepared"
  root.mkdir(exist_ok=True)
  data_dir, done = root / "tfds", root / "done"
  with open(root / "lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not done.exists():
      cd = base.get_config()
      cd.data.update(dataset="cmudict_g2p", data_dir=str(data_dir), max_source_len=32,
                     max_target_len=32, batch_size=8)
      load_task(from_configdict(cd), process_index=0, process_count=1)
      done.write_text("ok")
  return str(data_dir)
