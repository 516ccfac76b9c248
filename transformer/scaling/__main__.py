"""`python -m transformer.scaling fit RUNS...`: see transformer/scaling/command.py."""

from transformer import cli
from transformer.scaling import command

with cli.closed_pipe_is_quiet():
  raise SystemExit(command.main())
