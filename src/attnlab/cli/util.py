"""What every CLI module shares: the error convention ("attnlab: error: ..." on stderr, exit status 2) and
the status of a run stopped by Ctrl-C (130)."""
from __future__ import annotations

import sys

__all__ = ["fail", "EXIT_USAGE", "EXIT_INTERRUPTED"]

EXIT_USAGE = 2                 # bad input or a broken file: the same status argparse uses for usage errors
EXIT_INTERRUPTED = 130         # stopped by Ctrl-C (128 + SIGINT), as shells report it


def fail(msg: str) -> int:
    """Print ``attnlab: error: msg`` to stderr and return the exit status for it (2)."""
    print(f"attnlab: error: {msg}", file=sys.stderr)
    return EXIT_USAGE
