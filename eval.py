r"""Evaluates a trained run: `python eval.py --workdir=runs/g2p [--split=test] [--step=N|best|latest]`.

Which parameters: a run trained with `train.ema_decay > 0` is evaluated with its EMA parameters
unless `--params=raw`; `--average_last=N` evaluates the mean of the parameters (EMA or raw, as
`--params` says) of the run's N newest checkpoints (it needs `checkpoint.keep >= N`). The table and
metrics.<split>.json say which: `params` (ema|raw) and `averaged_steps`.

An ensemble: `--ensemble=runs/b,runs/c --out=runs/abc` evaluates the runs in --workdir, runs/b and
runs/c as one model whose next-token distribution is the mean of theirs (each run at --step, e.g.
its own best checkpoint; same vocabularies), with --workdir's data and decoding settings, and writes
the files to --out (`ensemble`, `ensemble_steps` and `ensemble_params` in the metrics say
which runs, steps and parameters).

Evaluates the WHOLE split: the teacher-forced loss, token accuracy and perplexity over every target
token, and the task's metrics (WER/PER for G2P, BLEU for translation, bits per char/byte for LMs)
over every example decoded. It prints a table that ends with the coverage (examples decoded and
tokens scored, each of the split's total) and writes `<workdir>/metrics.<split>.json` (the same,
coverage under "coverage") and `<workdir>/predictions.<split>.jsonl` (source, references,
hypothesis, score per line). On several hosts every host evaluates and only process 0 writes.

The run's in-training settings `eval.num_batches` / `eval.num_decode_examples` (a partial dev
evaluation during training) do not carry over. To evaluate less, ask for it explicitly:

  python eval.py --workdir=runs/g2p --config.eval.num_decode_examples=500   # decode the first 500
  python eval.py --workdir=runs/g2p --config.eval.num_batches=8             # loss on 8 batches

How `--config.*` overrides work here: the run's own config is the one training saved in
`<workdir>/config.json`; there is no --config file to give. `--config.key=value` flags are parsed
against the schema of configs/base.py (so types are checked and typos rejected), and only the keys
given on the command line are applied on top of the saved config, e.g.

  python eval.py --workdir=runs/g2p --config.eval.decode.method=beam --config.eval.decode.beam_size=8

Only keys that cannot change the trained parameters may be overridden: `eval.*`, `seed`,
`data.data_dir`, `data.eval_split`, `data.batch_size`, `model.attention_impl`,
`model.dtype`. Any other key (e.g. `--config.model.d_model`) is a one-line error.
"""

import sys

from absl import app
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
flags.mark_flags_as_required(["workdir"])


def main(argv):
  del argv  # cli.parse_flags rejects positional arguments
  cli.quiet_logging()
  # Imported here so that --help and flag errors do not pay for importing JAX.
  from transformer import evaluation  # pylint: disable=g-import-not-at-top
  from transformer import checkpoints  # pylint: disable=g-import-not-at-top
  overrides = dict(config_flags.get_override_values(flags.FLAGS["config"]))
  # ConfigError is a ValueError
  with cli.one_line_errors(ValueError, OSError, checkpoints.CheckpointError, model_config=lambda:
                           checkpoints.load_run_config(flags.FLAGS.workdir).model):
    evaluation.evaluate_split(flags.FLAGS.workdir, split=flags.FLAGS.split, step=flags.FLAGS.step,
                              overrides=overrides, params=flags.FLAGS.params,
                              average_last=flags.FLAGS.average_last,
                              ensemble=flags.FLAGS.ensemble, out_dir=flags.FLAGS.out)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
