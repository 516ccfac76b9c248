r"""`python -m transformer.scaling fit RUN [RUN|'GLOB' ...]`: Approach 2 and Approach 3 fitted to
the runs (workdirs, quoted globs, a members run or a sweep's workdir), printed side by side;
writes scaling.json (every number, every run) and scaling.png (IsoFLOP curves with their
vertices, the frontier with its interval, Approach 3's residuals) to --out (default: the first
RUN). --holdout=C leaves the budgets of C FLOPs and above out of the fit and checks the
predictions there against their runs; --predict=C1,C2 predicts at more budgets.

  python -m transformer.scaling fit runs/isoflop --holdout=4e11
  python -m transformer.scaling fit 'runs/isoflop/*' --params=total --bootstrap=400 --noplot

Unfinished and diverged runs are left out and named; runs on other data than the others are
refused (exit 2), as `python -m transformer.run.compare` names them.
"""

import json
import math
import os
import sys
from typing import Sequence

from absl import flags

from transformer import cli, files
from transformer.scaling import fits, observations, summary

USAGE = "python -m transformer.scaling fit RUN [RUN|'GLOB' ...]"


def _define(f: flags.FlagValues) -> None:
  flags.DEFINE_float("holdout", 0.0, "leave budgets of this many FLOPs and more out of the fit "
                     "and check the predictions there (0 = fit every budget)", flag_values=f)
  flags.DEFINE_list("predict", [], "more budgets (FLOPs) to predict N*, D* and the loss at",
                    flag_values=f)
  flags.DEFINE_enum("params", "non_embedding", ["non_embedding", "total"],
                    "the parameter count N of the fits", flag_values=f)
  flags.DEFINE_string("metric", "eval/loss", "each run's final loss: eval/<name> (the last "
                      "in-training evaluation) or <split>/<name> (eval.py's)", flag_values=f)
  flags.DEFINE_integer("bootstrap", 100, "bootstrap resamples of the runs per approach",
                       flag_values=f)
  flags.DEFINE_integer("seed", 0, "the bootstrap's seed", flag_values=f)
  flags.DEFINE_string("out", "", "directory of scaling.json and scaling.png (default: the first "
                      "RUN)", flag_values=f)
  flags.DEFINE_bool("plot", True, "write scaling.png", flag_values=f)


def _budgets(values: Sequence[str]) -> list[float]:
  out = []
  for v in values:
    try:
      out.append(float(v))
    except ValueError:
      raise observations.ScalingError(f"--predict: {v!r} is not a number of FLOPs") from None
    if not math.isfinite(out[-1]) or out[-1] <= 0:
      raise observations.ScalingError(f"--predict: {v} is not a positive number of FLOPs")
  return out


def fit(paths: Sequence[str], args: flags.FlagValues) -> str:
  """Runs the fits and writes scaling.json (and scaling.png); returns the printed text."""
  if args.bootstrap < 0:
    raise observations.ScalingError(f"--bootstrap={args.bootstrap}: must be >= 0")
  obs = observations.read(paths, args.metric, args.params)
  result = fits.analyse(obs, args.holdout, _budgets(args.predict), args.bootstrap, args.seed)
  result["params"] = args.params
  out = args.out or (paths[0] if files.isdir(paths[0]) else os.path.dirname(paths[0]) or ".")
  files.makedirs(out)
  path = os.path.join(out, "scaling.json")
  files.write_text_atomic(path, json.dumps(result, indent=1) + "\n")
  text = summary.text(result) + f"\nwrote {path}\n"
  if args.plot:
    from transformer.scaling import plots  # pylint: disable=g-import-not-at-top  (matplotlib)
    plots.plot(result, os.path.join(out, "scaling.png"))
    text += f"wrote {os.path.join(out, 'scaling.png')}\n"
  return text


def main(argv: Sequence[str] | None = None) -> int:
  """The command line; the exit status (2: runs or arguments that cannot be fitted)."""
  argv = sys.argv[1:] if argv is None else list(argv)
  if not argv or argv[0] not in ("fit", "--help", "-h", "--helpfull"):
    print(f"error: the command is `fit` (usage: {USAGE})", file=sys.stderr)
    return 2
  args, paths = cli.parse_own_flags(USAGE, _define, argv[1:] if argv[0] == "fit" else argv,
                                    __doc__)
  if not paths:
    print(f"error: name the runs to fit (usage: {USAGE})", file=sys.stderr)
    return 2
  try:
    print(fit(paths, args), end="")
  except observations.ScalingError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except ValueError as e:  # a fit that cannot be made (a budget without a vertex, ...)
    print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  return 0
