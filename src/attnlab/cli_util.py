"""What every CLI module shares: the error convention ("attnlab: error: ..." on stderr, exit status 2)."""
from __future__ import annotations

import sys

__all__ = ["fail", "EXIT_USAGE"]

EXIT_USAGE = 2                 # bad input or a broken file: the same status argparse uses for usage errors


def fail(msg: str) -> int:
    """Print ``attnlab: error: msg`` to stderr and return the exit status for it (2)."""
    print(f"attnlab: error: {msg}", file=sys.stderr)
    return EXIT_USAGE
