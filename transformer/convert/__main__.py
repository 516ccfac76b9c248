"""`python -m transformer.convert`: see transformer/convert/__init__.py."""

from transformer.convert import main

raise SystemExit(main())
