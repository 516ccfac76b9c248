r"""Evaluates a trained run: `python eval.py --workdir=runs/g2p [--split=test] [--step=N|best|latest]`.

Prints a table (loss, token accuracy, perplexity and the task's metrics: WER/PER for G2P, BLEU for
translation, bits per char/byte for LMs) and writes `<workdir>/metrics.<split>.json` and
`<workdir>/predictions.<split>.jsonl` (source, references, hypothesis, score per line).

How `--config.*` overrides work here: the run's own config is the one training saved in
`<workdir>/config.json`; there is no --config file to give. `--config.key=value` flags are parsed
against the schema of configs/base.py (so types are checked and typos rejected by absl), and only
the keys given on the command line are applied on top of the saved config, e.g.

  python eval.py --workdir=runs/g2p --config.eval.decode.method=beam --config.eval.decode.beam_size=8
  python eval.py --workdir=runs/g2p --config.eval.decode.method=greedy --config.eval.num_decode_examples=500

Only keys that cannot change the trained parameters may be overridden: `eval.*`, `seed`,
`data.data_dir`, `data.eval_split`, `data.batch_size`, `model.attention_impl`,
`model.dtype`. Any other key (e.g. `--config.model.d_model`) is a one-line error.
"""

import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from configs import base


def _bad_flag(e: Exception) -> None:
  """Exits with one line for a flag error (absl and config_flags raise deep tracebacks)."""
  msg = str(e).replace("\\n", " ").replace("\\'", "'").strip().strip("'\"").splitlines()
  hint = "; config keys are those of configs/base.py" if "config" in str(e) else ""
  print(f"error: bad flag ({type(e).__name__}: {msg[0] if msg else ''}){hint}", file=sys.stderr)
  sys.exit(1)


try:  # config_flags reads sys.argv here: an unknown --config.key fails at definition time
  config_flags.DEFINE_config_dict(
      "config", base.get_config(),
      "Overrides applied to the run's saved config.json, e.g. --config.eval.decode.beam_size=8.")
except (AttributeError, KeyError, ValueError) as error:
  _bad_flag(error)
flags.DEFINE_string("workdir", None, "The training run's workdir (holds config.json, checkpoints).")
flags.DEFINE_string("split", "test", "The split to evaluate: train, validation or test.")
flags.DEFINE_string("step", "latest", "Checkpoint step: an integer, 'latest' or 'best'.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  # Imported here so that --help and flag errors do not pay for importing JAX.
  from transformer import evaluation  # pylint: disable=g-import-not-at-top
  from transformer.checkpoints import CheckpointError  # pylint: disable=g-import-not-at-top
  overrides = dict(config_flags.get_override_values(flags.FLAGS["config"]))
  try:
    evaluation.evaluate(flags.FLAGS.workdir, split=flags.FLAGS.split, step=flags.FLAGS.step,
                        overrides=overrides)
  except (ValueError, CheckpointError, FileNotFoundError) as e:  # ConfigError is a ValueError
    print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
    sys.exit(1)


def parse_flags(argv):
  """absl flag parsing, with a bad `--config.key=value` override as one line instead of a trace."""
  try:
    return flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    _bad_flag(e)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
