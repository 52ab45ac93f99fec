"""The lab: experiments that check each claim of the theory, attention made visible, the report.

    verify      the ``attnlab verify`` runner: collects ``CLAIMS``, ``ACCOUNTING`` and ``REFUTED`` from the
                exp_*.py modules
    claims      ``Claim`` / ``VerifyContext``: what an experiment returns and receives
    report      the self-contained HTML report, its JSON twin, ``png_bytes`` for figures
    exp_*       the experiments, one theme per module

Nothing is imported here eagerly (experiments pull in torch, matplotlib, models): import the
module you need, or use the names below, which load on first use.

Example::

    from attnlab.lab import run_verify
    result = run_verify(quick=True, out="runs/verify")
"""
import importlib

_EXPORTS = {"Claim": "claims", "VerifyContext": "claims", "run_verify": "verify", "write_report": "report"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
