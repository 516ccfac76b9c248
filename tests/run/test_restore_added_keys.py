"""A run's config.json saved before a key was added loads with the value that reproduces it."""

import json

from configs import base
from transformer.config import from_configdict, to_dict
from transformer.run import restore


def test_a_config_saved_before_mup_loads_as_standard(tmp_path):
  saved = to_dict(from_configdict(base.get_config()))
  for key in restore.ADDED_KEYS["model"]:
    del saved["model"][key]
  (tmp_path / "config.json").write_text(json.dumps(saved))
  loaded = restore.load_run_config(str(tmp_path))
  assert (loaded.model.parametrization, loaded.model.mup_base_width) == ("standard", 0)
