"""Weights & Biases beside TensorBoard (train.wandb_project): `check_wandb` before anything runs
(the package, the mode, credentials where W&B runs online), `start_run` for the Reporter (the run
continued by a resumed run, its id in the workdir's WANDB_RUN_ID)."""

import importlib.util
import netrc
import os
from typing import Any, Mapping
import urllib.parse
import uuid

from transformer import config as config_lib, files

WANDB_RUN_ID = "wandb_run_id"  # in the workdir: the W&B run that a resumed run continues


# The modes W&B reads from WANDB_MODE ("dryrun" and "run": older names of offline and online).
WANDB_MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")


# Characters W&B refuses in a project name (wandb.init raises, after the workdir was written).
_NOT_IN_PROJECT = "/\\#?%:"


def _wandb_credentials() -> bool:
  """Whether W&B finds an API key without prompting: WANDB_API_KEY, an identity token file, or
  a netrc entry (NETRC, else ~/.netrc) for the host of WANDB_BASE_URL."""
  if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
    return True
  host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai")
  try:
    return netrc.netrc(os.environ.get("NETRC") or None).authenticators(host.hostname or "") \
        is not None
  except (OSError, netrc.NetrcParseError):
    return False


def check_wandb(project: str, mode: str = "") -> None:
  """Raises a one-line ConfigError when train.wandb_project (`project`) is set and W&B cannot
  start: a project name W&B refuses, the wandb package missing, WANDB_MODE not a mode, or an online run (train.wandb_mode
  `mode`, else WANDB_MODE) without credentials, where W&B would prompt or fail after the workdir
  was written."""
  if not project:
    return
  if len(project) > 128 or (bad := sorted(set(project) & set(_NOT_IN_PROJECT))):
    raise config_lib.ConfigError(
        f"train.wandb_project={project[:40]!r}{'...' if len(project) > 40 else ''}: W&B takes at "
        f"most 128 characters and none of {' '.join(_NOT_IN_PROJECT)}" +
        (f" (found {' '.join(bad)})" if len(project) <= 128 else f" (got {len(project)})"))
  if importlib.util.find_spec("wandb") is None:
    raise config_lib.ConfigError(f"train.wandb_project={project!r} needs the wandb package: "
                                 "pip install -e '.[wandb]'")
  env = os.environ.get("WANDB_MODE", "")
  if not mode and env and env not in WANDB_MODES:
    raise config_lib.ConfigError(f"WANDB_MODE={env!r} is not a W&B mode ({', '.join(WANDB_MODES)})"
                                 f" for train.wandb_project={project!r}")
  disabled = os.environ.get("WANDB_DISABLED", "").lower() in ("true", "1")
  if (mode or env or "online") in ("online", "run", "shared") and not disabled and (
      not _wandb_credentials()):
    raise config_lib.ConfigError(
        f"train.wandb_project={project!r} logs online but W&B has no API key (WANDB_API_KEY, "
        "or `wandb login`); or log locally: --config.train.wandb_mode=offline")


def start_run(workdir: str, config: Mapping[str, Any], record: Mapping[str, Any]) -> Any:
  """The W&B run logging beside TensorBoard when config's train.wandb_project is set, else None:
  the config with the provenance `record` as its config, named after the workdir, continued
  when the workdir names one already (WANDB_RUN_ID)."""
  train = config.get("train") or {}
  if not train.get("wandb_project"):
    return None
  check_wandb(train["wandb_project"], train.get("wandb_mode") or "")
  import wandb  # pylint: disable=g-import-not-at-top  (an optional extra)
  id_path = os.path.join(workdir, WANDB_RUN_ID)
  run_id = files.read_text(id_path).strip() if files.exists(id_path) else uuid.uuid4().hex[:8]
  local = "://" not in workdir  # W&B writes its files to a local directory only
  try:
    run = wandb.init(project=train["wandb_project"], mode=train.get("wandb_mode") or None,
                     dir=workdir if local else None,
                     name=os.path.basename(os.path.normpath(workdir)), id=run_id, resume="allow",
                     config={**config, "provenance": dict(record)},
                     reinit="create_new")  # train.members: one W&B run per member, side by side
  except Exception as e:  # pylint: disable=broad-except  (W&B's own: network, credentials, ...)
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    raise config_lib.ConfigError(f"train.wandb_project={train['wandb_project']!r}: W&B did not "
                                 f"start ({first}); --config.train.wandb_mode=offline logs "
                                 "locally") from None
  files.write_text_atomic(id_path, run_id)
  # The x-axis is our step: a resumed run logs again from its checkpoint, below W&B's own step.
  run.define_metric("step")
  run.define_metric("*", step_metric="step")
  return run
