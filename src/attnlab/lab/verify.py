"""The ``attnlab verify`` runner: collect every experiment, run each with timing, write the report.

Experiments live in the ``lab/exp_*.py`` modules named in ``MODULES``; each lists its functions
``(ctx: VerifyContext) -> Claim`` in ``CLAIMS`` (verified claims), ``ACCOUNTING`` (counts that hold
by construction: shown in the report, never counted) and ``REFUTED`` (claims of the theory measured and
found not borne out, as docs/results.md records: judged, shown, counted apart; see ``lab/claims.py``).
The whole verdict is ``VerifyResult.as_recorded``: every counted claim passed and every refuted one
failed without an error. A claim's id is known before it runs (see
``claim_id``), so ``only=[...]`` selects by id (or by module name) without running anything else.
An experiment that raises becomes a failed Claim carrying the traceback in ``error``: one broken
experiment never loses the rest of the report.

Example::

    result = run_verify(quick=True, only=["sqrt-dk-scaling"], out="runs/verify")
    result.all_passed, result.paths["html"]     # every counted claim (result.claims) passed
    result.as_recorded, result.departures       # ... and result.refuted still fail; what changed if not
"""
from __future__ import annotations

import importlib
import logging
import random
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from .claims import Claim, VerifyContext, as_recorded, departures

__all__ = ["MODULES", "ClaimEntry", "claim_id", "collect", "select", "run_one", "run_claims", "run_verify",
           "VerifyResult", "UnknownClaimError"]

log = logging.getLogger(__name__)

MODULES = ["exp_basics", "exp_complexity", "exp_sequential", "exp_longrange", "exp_pretrained"]
# lab/exp_code.py (the code model, issue #16) is not in the run: its claims do not hold yet (docs/results.md).

ClaimFn = Callable[[VerifyContext], Claim]


class UnknownClaimError(ValueError):
    """``only`` named an id that no experiment has."""


@dataclass(frozen=True)
class ClaimEntry:
    id: str             # the claim's id, known before running
    module: str         # "exp_basics"
    fn: ClaimFn
    kind: str = "claim"  # "claim" (CLAIMS), "accounting" (ACCOUNTING) or "refuted" (REFUTED): lab/claims.py KINDS


def claim_id(fn: Callable) -> str:
    """The id of the claim ``fn`` returns: ``fn.claim_id``, else its name without ``claim_`` (or ``account_``),
    kebab-cased.

    Example::

        def claim_causal_gradient(ctx): ...
        claim_id(claim_causal_gradient)          # "causal-gradient"
    """
    explicit = getattr(fn, "claim_id", None)
    if explicit:
        return str(explicit)
    name = getattr(fn, "__name__", type(fn).__name__)
    for prefix in ("claim_", "account_"):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    return name.replace("_", "-")


def _import(name: str):
    return importlib.import_module(f"{__package__}.{name}")


def _import_failed(name: str, exc: BaseException) -> ClaimEntry:
    """An entry that reports a module's import error as one failed claim."""
    def fn(ctx: VerifyContext) -> Claim:
        raise exc
    fn.__name__ = f"claim_{name}_import"
    fn.__doc__ = f"Importing attnlab.lab.{name} (its experiments could not be collected)."
    return ClaimEntry(claim_id(fn), name, fn)


def collect(modules: Sequence[str] = tuple(MODULES)) -> list[ClaimEntry]:
    """Every experiment of ``modules``, in order. A module that fails to import yields one failing entry."""
    entries: list[ClaimEntry] = []
    for name in modules:
        try:
            mod = _import(name)
        except Exception as e:                                   # broken module: report it, run the rest
            log.error("verify: importing %s failed: %s", name, e)
            entries.append(_import_failed(name, e))
            continue
        for attr, kind, default in (("CLAIMS", "claim", None), ("ACCOUNTING", "accounting", []),
                                    ("REFUTED", "refuted", [])):
            fns = getattr(mod, attr, default)
            if not isinstance(fns, (list, tuple)) or not all(callable(f) for f in fns):
                entries.append(_import_failed(name, TypeError(
                    f"attnlab.lab.{name}.{attr} must be a list of functions (ctx) -> Claim, got {type(fns).__name__}")))
                continue
            entries += [ClaimEntry(claim_id(f), name, f, kind) for f in fns]
    ids = [e.id for e in entries]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        log.warning("verify: claim ids %s are used twice; --only selects all of them", dup)
    return entries


def select(entries: Sequence[ClaimEntry], only: Optional[Sequence[str]]) -> list[ClaimEntry]:
    """The entries whose id (or module name) is in ``only``; all of them when ``only`` is empty/None."""
    if not only:
        return list(entries)
    known = {e.id for e in entries} | {e.module for e in entries}
    unknown = [o for o in only if o not in known]
    if unknown:
        raise UnknownClaimError(f"unknown claim id {', '.join(map(repr, unknown))}; choose from "
                                f"{', '.join(e.id for e in entries)} (or a module: "
                                f"{', '.join(dict.fromkeys(e.module for e in entries))})")
    wanted = set(only)
    return [e for e in entries if e.id in wanted or e.module in wanted]


def _seed(seed: int) -> None:
    import torch
    random.seed(seed)
    torch.manual_seed(seed)


def _error_claim(entry: ClaimEntry, err: str) -> Claim:
    doc = (entry.fn.__doc__ or "").strip().split("\n")[0]
    return Claim(entry.id, doc or entry.id, statement=doc or f"(experiment {entry.module}.{entry.id})",
                 criterion="(not reached: the experiment raised before judging)", passed=False, error=err,
                 kind=entry.kind)


def run_one(entry: ClaimEntry, ctx: VerifyContext) -> Claim:
    """Run one experiment, seeded with ``ctx.seed``; its exception becomes a failed Claim with the traceback."""
    import torch
    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    _seed(ctx.seed)                  # each claim reproducible on its own, whatever ran before it
    t0 = time.perf_counter()
    try:
        claim = entry.fn(ctx)
        if not isinstance(claim, Claim):
            raise TypeError(f"{entry.module}.{getattr(entry.fn, '__name__', entry.id)} returned "
                            f"{type(claim).__name__}, not a Claim")
    except Exception:               # KeyboardInterrupt still stops the run
        claim = _error_claim(entry, traceback.format_exc(limit=-8))
    finally:
        torch.set_default_dtype(dtype)                            # an experiment must not leak global state
        torch.set_grad_enabled(grad)
    claim.seconds = time.perf_counter() - t0
    claim.passed = bool(claim.passed) and claim.error is None
    claim.kind = entry.kind              # the module's list decides: CLAIMS counted, ACCOUNTING/REFUTED apart
    if claim.id != entry.id:
        log.warning("verify: %s returned id %r but is selected as %r (name it claim_%s or set fn.claim_id)",
                    entry.module, claim.id, entry.id, claim.id.replace("-", "_"))
    return claim


def run_claims(entries: Sequence[ClaimEntry], ctx: VerifyContext) -> list[Claim]:
    """Run ``entries`` in order, logging one progress line before and after each."""
    claims = []
    for i, entry in enumerate(entries, 1):
        log.info("[%d/%d] %s ...", i, len(entries), entry.id)
        claim = run_one(entry, ctx)
        verdict = "PASS" if claim.passed else ("ERROR" if claim.error else "FAIL")
        log.info("[%d/%d] %s: %s in %.1f s", i, len(entries), entry.id, verdict, claim.seconds)
        claims.append(claim)
    return claims


@dataclass
class VerifyResult:
    claims: list[Claim]                          # the verified claims: the verdict and the count
    paths: dict = field(default_factory=dict)    # {"html", "json", "figures"} from report.write_report
    seconds: float = 0.0
    accounting: list[Claim] = field(default_factory=list)   # shown in the report, not counted
    refuted: list[Claim] = field(default_factory=list)      # recorded as not borne out: expected to fail

    @property
    def all_passed(self) -> bool:
        """Every counted claim passed (and there was at least one); refuted and accounting entries aside."""
        return bool(self.claims) and all(c.passed for c in self.claims)

    @property
    def departures(self) -> list[str]:
        """What differs from the record, one line each (a refuted claim that passes or raised, ...)."""
        return departures(self.claims + self.refuted + self.accounting)

    @property
    def as_recorded(self) -> bool:
        """The whole verdict, the CLIs' exit status: every counted claim passed, every refuted claim failed
        without an error, no accounting entry raised, and something ran."""
        return as_recorded(self.claims + self.refuted + self.accounting)


def _meta(quick: bool, only, seed: int, argv) -> dict:
    from .. import __version__
    from ..measure.machine import machine_info
    return {"attnlab": __version__, **machine_info(argv), "quick": quick, "only": list(only or []), "seed": seed}


def run_verify(*, quick: bool = False, only: Optional[Sequence[str]] = None, out: str = "runs/verify",
               seed: int = 0, modules: Sequence[str] = tuple(MODULES), argv: Optional[list[str]] = None,
               entries: Optional[Sequence[ClaimEntry]] = None) -> VerifyResult:
    """Collect, select, run and report.

    Args:
        quick: small sizes and fewer repeats (verify --quick).
        only: claim ids or module names to run (None: all).
        out: directory of report.html, report.json and the PNGs; scratch files go to ``out/work``.
        entries: run these instead of collecting ``modules`` (tests).
    Raises:
        UnknownClaimError: ``only`` names no known claim (nothing has run).
    """
    t0 = time.perf_counter()
    chosen = select(collect(modules) if entries is None else entries, only)
    workdir = Path(out) / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    claims = run_claims(chosen, VerifyContext(quick=quick, workdir=workdir, seed=seed))
    meta = _meta(quick, only, seed, argv)
    meta["total_seconds"] = round(time.perf_counter() - t0, 1)
    from .report import write_report
    paths = write_report(claims, out, meta)
    kind = {k: [c for c in claims if c.kind == k] for k in ("claim", "accounting", "refuted")}
    return VerifyResult(kind["claim"], paths, time.perf_counter() - t0, kind["accounting"], kind["refuted"])
