"""`python -m transformer.convert`: see transformer/convert/__init__.py."""

from transformer import cli
from transformer.convert import main

with cli.closed_pipe_is_quiet():
  raise SystemExit(main())
