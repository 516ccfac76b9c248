"""A run's config.json saved before a key was added loads with the value that reproduces it."""

import json

from configs import base
from transformer.config import from_configdict, to_dict
from transformer.run import restore


def test_a_config_saved_before_mup_and_the_harness_loads_as_it_ran(tmp_path):
  saved = to_dict(from_configdict(base.get_config()))
  for section, keys in restore.ADDED_KEYS.items():
    for key in keys:
      del saved[section][key]
  (tmp_path / "config.json").write_text(json.dumps(saved))
  loaded = restore.load_run_config(str(tmp_path))
  assert (loaded.model.parametrization, loaded.model.mup_base_width) == ("standard", 0)
  assert (loaded.eval.harness_tasks, loaded.eval.harness_limit) == ("", 0)
