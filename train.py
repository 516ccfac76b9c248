r"""Trains a transformer: `python train.py --config=configs/g2p.py:tiny --workdir=runs/g2p_tiny`.

Any config key can be overridden on the command line, e.g. `--config.model.positional=rope
--config.train.num_steps=2000`. Rerunning the same command in the same workdir resumes from the
latest checkpoint (a finished run is not retrained); SIGTERM saves a checkpoint and exits 0.
A bad config, an incompatible workdir or a diverged run prints one line and exits 1.
"""

import logging as pylogging
import os
import sys

from absl import app
from absl import flags
from absl import logging
import ml_collections
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/g2p.py:tiny.",
                                 lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and logs.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  # Orbax logs every save at INFO and XLA its missing TPU/GPU backends: keep their warnings only.
  logging.get_absl_handler().addFilter(lambda r: r.levelno >= pylogging.WARNING or not any(
      name in r.pathname for name in ("orbax", "xla_bridge")))
  # Imported here so that --help and flag errors do not pay for importing JAX.
  from transformer import training  # pylint: disable=g-import-not-at-top
  from transformer.checkpoints import CheckpointError  # pylint: disable=g-import-not-at-top
  from transformer.config import ConfigError  # pylint: disable=g-import-not-at-top
  try:
    metrics = training.train_and_evaluate(flags.FLAGS.config, flags.FLAGS.workdir)
  except (ConfigError, CheckpointError, training.TrainingDiverged) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  summary = " ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if k != "step")
  print(f"done: step={metrics.get('step')} {summary}")


def parse_flags(argv):
  """absl flag parsing, with a bad `--config.key=value` override as one line instead of a trace."""
  for arg in argv[1:]:
    if arg.startswith("--config="):
      path = arg.split("=", 1)[1].split(":", 1)[0]
      if not os.path.isfile(path):
        print(f"error: --config file {path} not found", file=sys.stderr)
        sys.exit(1)
  try:
    rest = flags.FLAGS(argv)
    config = flags.FLAGS.config
    if not isinstance(config, ml_collections.ConfigDict):  # a config file that failed to load
      config.__getattr__("_")
    return rest
  except Exception as e:  # pylint: disable=broad-except
    msg = str(e).splitlines()[0] if str(e) else ""
    print(f"error: bad flag ({type(e).__name__}: {msg}); config keys are those of configs/base.py",
          file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
