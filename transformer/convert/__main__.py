"""`python -m transformer.convert`: see transformer/convert/__init__.py."""

import sys

from transformer.convert import main

sys.exit(main())
