"""``python -m attnlab ...`` is the same as the ``attnlab`` command."""
import sys

from .cli import main

sys.exit(main())
