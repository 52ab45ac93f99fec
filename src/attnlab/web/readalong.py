"""The lesson's PyTorch read-along: fixed programs, shown on the page and run by the local torch on request.

Each program is an ordered list of cells (a title and source text). ``GET /lesson/api/readalong`` lists
them, so the page shows exactly this text; ``POST /lesson/api/readalong/{name}`` runs exactly this text,
cell after cell in one namespace, and returns each cell's printed output. The browser only ever sends a
program's *name*: code from the browser is never run (an unknown name is a 404 in ``web.lesson``).

The "self-attention" program computes one layer of self-attention three ways: ``nn.MultiheadAttention``,
by hand (the in-projection split into Q, K, V, heads, softmax(QK^T/sqrt(d_k))V, out-projection), and with
``attnlab.attention`` on the same heads; its ``agreement`` dict (max |difference|) is what the page checks
against ``TOLERANCE``.

Example::

    run_program("self-attention")["agreement"]    # {'manual vs nn.MultiheadAttention': 1.1e-16, ...}
"""
from __future__ import annotations

import functools
import threading
import time
from importlib import resources
from dataclasses import dataclass

import torch

__all__ = ["Cell", "Program", "PROGRAMS", "TOLERANCE", "run_program", "describe_programs"]

TOLERANCE = 1e-6           # the page's "they agree" line: float64 differences are ~1e-16, far below


def _source(name: str) -> str:
    """A cell's source text, kept as package data (web/lesson/readalong_NAME.txt) rather than in this module."""
    return (resources.files("attnlab.web") / "lesson" / f"readalong_{name}.txt").read_text(encoding="utf-8")


@dataclass(frozen=True)
class Cell:
    title: str
    code: str


@dataclass(frozen=True)
class Program:
    title: str
    cells: tuple[Cell, ...]


# The cells' programs print: they live in web/lesson/readalong_*.txt (package data, shown and run as is),
# not as string constants here, so the library's own code does not write to stdout itself.
PROGRAMS: dict[str, Program] = {
    "self-attention": Program("One layer of self-attention, three ways", (
        Cell("Set-up: one sequence and a torch layer", _source("setup")),
        Cell("torch.nn.MultiheadAttention", _source("torch")),
        Cell("By hand: scaled dot-product self-attention", _source("manual")),
        Cell("attnlab.attention on the same heads", _source("attnlab")),
        Cell("Do the three agree?", _source("agree")),
    )),
    "scaling": Program("Why 1/sqrt(d_k): softmax saturation, with torch's autograd", (
        Cell("Unscaled vs scaled scores", _source("scaling")),
    )),
}

_RUN_LOCK = threading.Lock()      # one program at a time: they are tiny, and torch's RNG is forked per run


def describe_programs() -> dict:
    """Every program's title and cells (title, code): exactly the text ``run_program`` executes."""
    return {name: dict(title=p.title, cells=[dict(title=c.title, code=c.code) for c in p.cells])
            for name, p in PROGRAMS.items()}


def run_program(name: str) -> dict:
    """Run the named program's cells in order in one fresh namespace; raises KeyError for an unknown name.

    Returns {name, title, cells: [{title, code, output}], agreement: {label: float}, tolerance, agree
    (None for a program without an ``agreement`` dict), seconds}. ``print`` inside the cells writes to
    the cell's output (not the server's stdout), and the global torch RNG is restored afterwards, so a
    run leaves the server as it found it.
    """
    program = PROGRAMS[name]
    start = time.perf_counter()
    cells = []
    with _RUN_LOCK, torch.random.fork_rng(devices=[]):
        namespace: dict = {"__name__": "attnlab_readalong"}
        for cell in program.cells:
            lines: list[str] = []
            namespace["print"] = functools.partial(_collect, lines)
            # The only exec in the package: its argument is a constant of this module, never request data.
            exec(compile(cell.code, f"<read-along {name}: {cell.title}>", "exec"), namespace)
            cells.append(dict(title=cell.title, code=cell.code, output="".join(lines)))
    agreement = {str(k): float(v) for k, v in namespace.get("agreement", {}).items()}
    return dict(name=name, title=program.title, cells=cells, agreement=agreement, tolerance=TOLERANCE,
                agree=all(v <= TOLERANCE for v in agreement.values()) if agreement else None,
                seconds=round(time.perf_counter() - start, 3))


def _collect(lines: list[str], *args, sep: str = " ", end: str = "\n", **_ignored) -> None:
    lines.append(sep.join(str(a) for a in args) + end)
