"""What every CLI module shares: the error convention ("attnlab: error: ..." on stderr; exit status 2 for
bad input, 1 for a failure at run time), the status of a run stopped by Ctrl-C (130), and the checks an
output path gets before any work starts."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["fail", "fail_run", "writable_dir", "writable_file", "EXIT_USAGE", "EXIT_FAILURE", "EXIT_INTERRUPTED"]

EXIT_FAILURE = 1               # a failure at run time (disk full, a non-finite loss): the input was fine
EXIT_USAGE = 2                 # bad input or a broken file: the same status argparse uses for usage errors
EXIT_INTERRUPTED = 130         # stopped by Ctrl-C (128 + SIGINT), as shells report it


def fail(msg: str) -> int:
    """Print ``attnlab: error: msg`` to stderr and return the exit status for it (2)."""
    print(f"attnlab: error: {msg}", file=sys.stderr)
    return EXIT_USAGE


def fail_run(msg: str) -> int:
    """Print ``attnlab: error: msg`` to stderr and return the status of a run-time failure (1)."""
    print(f"attnlab: error: {msg}", file=sys.stderr)
    return EXIT_FAILURE


def _existing_parent(path: Path) -> Path:
    """The nearest ancestor of ``path`` that exists (where a new directory would be created)."""
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def _can_write_in(directory: Path) -> bool:
    """Whether a file can be created in ``directory``, by creating one and removing it: ``os.access`` says
    yes to root on a directory without write bits and on /proc, where a write still fails."""
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".attnlab-probe-")
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def writable_dir(path: str | os.PathLike, flag: str, need_bytes: int = 0) -> Path:
    """``path`` as a Path if a command can write a directory there, else ValueError naming ``flag``.

    Checked before any work: not an existing file, the directory (or its nearest existing parent, where it
    would be created) writable, and at least ``need_bytes`` free on its file system. Nothing is left behind.

    >>> writable_dir("/tmp/attnlab-run", "--out")  # doctest: +SKIP
    PosixPath('/tmp/attnlab-run')
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path} is a file, not a directory; give a directory path")
    base = _existing_parent(path)
    if not base.is_dir():
        raise ValueError(f"{flag} {path}: {base} is a file, not a directory")
    if not _can_write_in(base):
        raise ValueError(f"{flag} {path}: {base} is not writable; choose a directory you can write")
    free = shutil.disk_usage(base).free
    if need_bytes and free < need_bytes:
        raise ValueError(f"{flag} {path}: {free / 2**20:.0f} MiB free on its disk, {need_bytes / 2**20:.0f} MiB "
                         "needed; free space or choose another directory")
    return path


def writable_file(path: str | os.PathLike, flag: str) -> Path:
    """``path`` as a Path if a command can write a file there, else ValueError naming ``flag``: not a
    directory, and its directory (or nearest existing parent, where it would be created) writable.

    >>> writable_file("/tmp/bench.json", "--json")  # doctest: +SKIP
    PosixPath('/tmp/bench.json')
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a directory; give a file path")
    base = _existing_parent(path.parent)
    if not base.is_dir() or not _can_write_in(base):
        raise ValueError(f"{flag} {path}: {base} is not a writable directory; choose another path")
    return path
