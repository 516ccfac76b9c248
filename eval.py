r"""Evaluates a trained run on a whole split; writes its metrics and predictions.

  python eval.py --workdir=runs/g2p_tiny --split=test --step=best
  python eval.py --workdir=runs/g2p_tiny --config.eval.decode.method=beam \
      --config.eval.decode.beam_size=8
  python eval.py --workdir=runs/a --ensemble=runs/b,runs/c --out=runs/abc --step=best

--split, --step (N | best | latest), --params (auto | ema | raw) and --average_last=N choose the
data and the parameters; --ensemble evaluates several runs as one model. `--config.KEY=VALUE`
changes the run's saved config.json for this evaluation, for keys that cannot change what was
trained (eval.*, data.data_dir, ...). Prints a table; writes metrics.<split>.json and
predictions.<split>.jsonl to the workdir (or --out). What is computed: transformer/infer/evaluation.py;
examples: the README's "Evaluation and decoding".
"""

import sys

from absl import flags
from ml_collections import config_flags

from configs import base
from transformer import cli

try:  # config_flags reads sys.argv here: an unknown --config.key fails at definition time
  config_flags.DEFINE_config_dict(
      "config", base.get_config(),
      "Overrides applied to the run's saved config.json, e.g. --config.eval.decode.beam_size=8 or "
      "--config.eval.num_decode_examples=500 (default: the whole split).")
except Exception as error:  # pylint: disable=broad-except
  cli.fail(cli.flag_error(error, sys.argv[1:]))
flags.DEFINE_string("workdir", None, "The training run's workdir (holds config.json, checkpoints).")
flags.DEFINE_string("split", "test", "The split to evaluate (whole): train, validation or test.")
flags.DEFINE_string("step", "latest", "Checkpoint step: an integer, 'latest' or 'best'.")
flags.DEFINE_enum("params", "auto", ["auto", "ema", "raw"],
                  "Which parameters: auto (the EMA if the run was trained with train.ema_decay > 0, "
                  "else the raw ones), ema or raw.")
flags.DEFINE_integer("average_last", 0, "Evaluate the mean of the parameters of the run's N newest "
                     "checkpoints (needs checkpoint.keep >= N); 0 = one checkpoint (--step).")
flags.DEFINE_list("ensemble", [], "Further runs' workdirs (same vocabularies): evaluate them with "
                  "--workdir as one model, the mean of their probabilities, each at --step.")
flags.DEFINE_string("out", None, "Where the metrics and predictions go (required with --ensemble; "
                    "default for a single run: its --workdir).")
flags.DEFINE_list("harness_tasks", [], "lm-evaluation-harness tasks (names, comma-separated): "
                  "run them instead of --split's evaluation; prints the harness's table and writes "
                  "metrics.harness.json (docs/evaluation.md; needs the eval extra).")
flags.DEFINE_integer("harness_num_fewshot", None, "Few-shot examples per harness request (default: "
                     "each task's own).")
flags.DEFINE_integer("harness_limit", 0, "Documents per harness task (0 = all).")
flags.DEFINE_string("harness_include_path", "", "A directory of the harness's task YAML files, "
                    "searched before the harness's own tasks.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  del argv  # cli.parse_flags rejects positional arguments
  cli.quiet_logging()
  # Imported here so that --help and flag errors do not pay for importing JAX.
  from transformer.infer import evaluation  # pylint: disable=g-import-not-at-top
  from transformer.run import checkpoints, restore# pylint: disable=g-import-not-at-top
  overrides = dict(config_flags.get_override_values(flags.FLAGS["config"]))
  if flags.FLAGS.harness_tasks:
    harness(overrides)
    return
  # ConfigError is a ValueError
  with cli.one_line_errors(ValueError, OSError, checkpoints.CheckpointError, model_config=lambda:
                           restore.load_run_config(flags.FLAGS.workdir).model):
    evaluation.evaluate_split(flags.FLAGS.workdir, split=flags.FLAGS.split, step=flags.FLAGS.step,
                              overrides=overrides, params=flags.FLAGS.params,
                              average_last=flags.FLAGS.average_last,
                              ensemble=flags.FLAGS.ensemble, out_dir=flags.FLAGS.out)


def harness(overrides: dict) -> None:
  """--harness_tasks: the harness's tasks on the run (transformer/infer/harness/tasks.py)."""
  from transformer.run import checkpoints, restore  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  if overrides:
    cli.fail(f"--config.* overrides do not apply to --harness_tasks (given: {sorted(overrides)})")
  try:
    from transformer.infer.harness import tasks  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    cli.fail(f"--harness_tasks needs lm-eval ({e}): pip install -e '.[eval]'")
  with cli.one_line_errors(ValueError, OSError, checkpoints.CheckpointError, model_config=lambda:
                           restore.load_run_config(f.workdir).model):
    tasks.evaluate_workdir(f.workdir, f.harness_tasks, f.harness_num_fewshot, f.harness_limit,
                           f.harness_include_path, step=f.step, params=f.params,
                           average_last=f.average_last, ensemble=f.ensemble, out_dir=f.out)


if __name__ == "__main__":
  cli.run(main)
