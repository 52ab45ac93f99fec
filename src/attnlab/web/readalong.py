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
from dataclasses import dataclass

import torch

__all__ = ["Cell", "Program", "PROGRAMS", "TOLERANCE", "run_program", "describe_programs"]

TOLERANCE = 1e-6           # the page's "they agree" line: float64 differences are ~1e-16, far below


@dataclass(frozen=True)
class Cell:
    title: str
    code: str


@dataclass(frozen=True)
class Program:
    title: str
    cells: tuple[Cell, ...]


_SETUP = """\
import torch
import attnlab

torch.manual_seed(0)
seq, d, h = 5, 16, 4                       # 5 tokens, model width d = 16, h = 4 heads of width d_k = 4
X = torch.randn(1, seq, d, dtype=torch.float64)           # (1, 5, 16): one sequence, batch first
mha = torch.nn.MultiheadAttention(d, h, batch_first=True, dtype=torch.float64)
print("X", tuple(X.shape), " in_proj_weight", tuple(mha.in_proj_weight.shape))
"""

_TORCH = """\
# query = key = value = X: that is what makes it *self*-attention
out_torch, w_torch = mha(X, X, X, average_attn_weights=False)   # (1, 5, 16), (1, 4, 5, 5)
print("out", tuple(out_torch.shape), " weights", tuple(w_torch.shape))
"""

_MANUAL = """\
W_q, W_k, W_v = mha.in_proj_weight.chunk(3)   # each (16, 16), stored (out, in) like nn.Linear
b_q, b_k, b_v = mha.in_proj_bias.chunk(3)     # each (16,)
Q = X @ W_q.T + b_q                            # (1, 5, 16)
K = X @ W_k.T + b_k                            # (1, 5, 16)
V = X @ W_v.T + b_v                            # (1, 5, 16)

def split_heads(t):                            # (1, 5, 16) -> (1, 4, 5, 4): h heads of width d // h
    return t.view(1, seq, h, d // h).transpose(1, 2)

q, k, v = split_heads(Q), split_heads(K), split_heads(V)
scores = q @ k.transpose(-2, -1) / (d // h) ** 0.5    # (1, 4, 5, 5): one score per (query, key) pair
weights = scores.softmax(dim=-1)                      # (1, 4, 5, 5): every row sums to 1
context = weights @ v                                 # (1, 4, 5, 4)
merged = context.transpose(1, 2).reshape(1, seq, d)   # (1, 5, 16): the heads side by side
out_manual = mha.out_proj(merged)                     # (1, 5, 16)
print("scores", tuple(scores.shape), " out", tuple(out_manual.shape))
print("row sums of head 0:", [round(s, 12) for s in weights[0, 0].sum(-1).tolist()])
"""

_ATTNLAB = """\
# the same heads through attnlab; the scale defaults to 1/sqrt(d_k) = 1/sqrt(4)
context_al, w_al = attnlab.attention(q, k, v, return_weights=True)   # (1, 4, 5, 4), (1, 4, 5, 5)
out_attnlab = mha.out_proj(context_al.transpose(1, 2).reshape(1, seq, d))   # (1, 5, 16)
print("out", tuple(out_attnlab.shape), " weights", tuple(w_al.shape))
"""

_AGREE = """\
agreement = {
    "manual vs nn.MultiheadAttention": (out_manual - out_torch).abs().max().item(),
    "attnlab vs nn.MultiheadAttention": (out_attnlab - out_torch).abs().max().item(),
    "attnlab weights vs nn.MultiheadAttention weights": (w_al - w_torch).abs().max().item(),
}
for name, diff in agreement.items():
    print(f"max |difference|, {name}: {diff:.1e}")
"""

_SCALING = """\
import torch

torch.manual_seed(0)
print(" d_k  scaled  max softmax weight  largest |dp_i/ds_j|")
for d_k in (4, 64, 1024):
    q = torch.randn(d_k, dtype=torch.float64)              # (d_k,) one query
    keys = torch.randn(8, d_k, dtype=torch.float64)        # (8, d_k) eight keys
    for scaled in (False, True):
        s = keys @ q / (d_k ** 0.5 if scaled else 1.0)     # (8,) scores: variance d_k unscaled, 1 scaled
        jac = torch.autograd.functional.jacobian(lambda t: t.softmax(-1), s)   # (8, 8)
        p = s.softmax(-1)
        print(f"{d_k:4d}  {str(scaled):6s}  {p.max().item():18.4f}  {jac.abs().max().item():.2e}")
"""

PROGRAMS: dict[str, Program] = {
    "self-attention": Program("One layer of self-attention, three ways", (
        Cell("Set-up: one sequence and a torch layer", _SETUP),
        Cell("torch.nn.MultiheadAttention", _TORCH),
        Cell("By hand: scaled dot-product self-attention", _MANUAL),
        Cell("attnlab.attention on the same heads", _ATTNLAB),
        Cell("Do the three agree?", _AGREE),
    )),
    "scaling": Program("Why 1/sqrt(d_k): softmax saturation, with torch's autograd", (
        Cell("Unscaled vs scaled scores", _SCALING),
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
