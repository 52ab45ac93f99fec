"""Text corpora that need no download: Python's own documentation and standard library, or your files.

Sources (everything ships with the Python interpreter that runs attnlab):

- ``docs``: English prose, the ``pydoc_data.topics.topics`` dict (the text behind ``help("with")``,
  generated from the Python documentation; ~465 KB, 79 topics on CPython 3.11). Topics are joined
  in sorted key order, separated by a blank line.
- ``stdlib``: Python code, the standard library's ``.py`` files under
  ``sysconfig.get_paths()["stdlib"]``. Selection: every ``*.py`` path under that directory in
  sorted (POSIX string) order, skipping any path with a directory component named ``test``,
  ``tests``, ``idle_test``, ``site-packages``, ``dist-packages`` or ``__pycache__`` (test data
  holds deliberately odd encodings and huge generated files) and files that are not valid UTF-8;
  files are taken in that order while their total size stays within ``max_bytes`` (default 5 MB);
  a file that would overflow the budget is skipped. Files are separated by a blank line. The corpus
  depends on the Python version (3.11.7 here), and ``corpus_info`` records what was taken.
- a path: one UTF-8 text file, or a directory whose regular files (hidden ones excepted) are read
  in sorted relative-path order and joined with a blank line.

Example::

    corpus = load_corpus("docs")             # corpus.text: str, ~465k characters
    corpus.info                              # {"name": "docs", "chars": ..., "bytes": ..., "topics": 79, ...}
"""
from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Union

__all__ = ["Corpus", "load_corpus", "BUILTIN_CORPORA", "read_text_file"]

BUILTIN_CORPORA = ("docs", "stdlib")
STDLIB_MAX_BYTES = 5_000_000
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
_SEP = "\n\n"


def read_text_file(path: Union[str, Path]) -> str:
    """The UTF-8 text of one file; a ValueError names the file and the first bad byte offset."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text: byte {e.start} (0x{data[e.start]:02x}) cannot be decoded "
                         f"({e.reason}); convert the file to UTF-8 (e.g. iconv -t utf-8) or leave it out") from None


def _docs() -> tuple[str, dict]:
    from pydoc_data.topics import topics
    keys = sorted(topics)
    return _SEP.join(topics[k] for k in keys), {"topics": len(keys), "source": "pydoc_data.topics"}


def _stdlib_files(max_bytes: int) -> tuple[list[Path], Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]           # prune: never walk into them
        rel = Path(dirpath).relative_to(root)
        found += [(rel / f).as_posix() for f in filenames if f.endswith(".py")]
    chosen, total = [], 0
    for rel in sorted(found):
        size = (root / rel).stat().st_size
        if total + size <= max_bytes:
            chosen.append(root / rel)
            total += size
    return chosen, root


def _stdlib(max_bytes: int = STDLIB_MAX_BYTES) -> tuple[str, dict]:
    files, root = _stdlib_files(max_bytes)
    texts, skipped = [], []
    for path in files:
        try:
            texts.append(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError:
            skipped.append(path.relative_to(root).as_posix())
    return _SEP.join(texts), {"root": str(root), "files": len(texts), "not_utf8": skipped,
                              "max_bytes": max_bytes, "source": "sysconfig stdlib *.py, sorted, tests skipped"}


def _from_path(path: Path) -> tuple[str, dict]:
    if not path.exists():
        raise ValueError(f"data path {str(path)!r} does not exist; pass 'docs', 'stdlib', a UTF-8 text file "
                         "or a directory of text files")
    if path.is_file():
        return read_text_file(path), {"files": 1, "source": str(path)}
    files = sorted((p for p in path.rglob("*") if p.is_file()
                    and not any(part.startswith(".") for part in p.relative_to(path).parts)),
                   key=lambda p: p.relative_to(path).as_posix())
    if not files:
        raise ValueError(f"data directory {str(path)!r} holds no (non-hidden) files")
    return _SEP.join(read_text_file(p) for p in files), {"files": len(files), "source": str(path)}


@dataclass(frozen=True)
class Corpus:
    text: str
    info: dict          # name, chars, bytes, files/topics and how they were selected (saved with checkpoints)


def load_corpus(name: str) -> Corpus:
    """The corpus ``"docs"``, ``"stdlib"``, or a path to a UTF-8 file or a directory of them."""
    if name == "docs":
        text, info = _docs()
    elif name == "stdlib":
        text, info = _stdlib()
    else:
        text, info = _from_path(Path(name))
    if not text.strip():
        raise ValueError(f"corpus {name!r} is empty (no non-whitespace text); give it some text to learn from")
    return Corpus(text, {"name": name, "chars": len(text), "bytes": len(text.encode("utf-8")), **info})
