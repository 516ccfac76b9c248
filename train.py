r"""Trains a transformer: `python train.py --config=configs/g2p.py:tiny --workdir=runs/g2p_tiny`.

Any config key can be overridden on the command line, e.g. `--config.model.positional=rope
--config.train.num_steps=2000`. Rerunning the same command in the same workdir resumes from the
latest checkpoint (a finished run is not retrained); SIGTERM saves a checkpoint and exits 0.
A bad config, an incompatible workdir or a diverged run prints one line and exits 1.
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from transformer import cli

config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/g2p.py:tiny.",
                                 lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and logs.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv  # cli.parse_flags rejects positional arguments
  cli.quiet_logging()
  # Imported here so that --help and flag errors do not pay for importing JAX.
  from transformer import training  # pylint: disable=g-import-not-at-top
  from transformer.checkpoints import CheckpointError  # pylint: disable=g-import-not-at-top
  from transformer.config import ConfigError  # pylint: disable=g-import-not-at-top
  try:
    metrics = training.train_and_evaluate(flags.FLAGS.config, flags.FLAGS.workdir)
  except (ConfigError, CheckpointError, training.TrainingDiverged) as e:
    cli.fail(str(e))
  summary = " ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if k != "step")
  print(f"done: step={metrics.get('step')} {summary}")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
