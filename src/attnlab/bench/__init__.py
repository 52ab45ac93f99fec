"""Benchmarks: attention kernels timed against torch SDPA and FlexAttention, with FLOPs and memory.

One concern per module:

    cases        the problems (mask kind x n x dtype x mode), their masks in every form, useful FLOPs
    contestants  attnlab backends and the torch peers, each as a zero-argument step
    memory       peak memory of one step in a fresh subprocess; power-law extrapolation
    kernels      the benchmark loop (``BenchConfig``, ``QUICK``, ``run_kernels``)
    scaling      the tiled-vs-reference memory scaling preset (``--memory-scaling``)
    report       the plain-text table and the JSON file

Timing and the machine facts live in ``attnlab.measure`` (the lab times with them too); ``bench.timing``
and ``bench.machine`` still answer, with a DeprecationWarning.

The command line is ``attnlab bench`` (see ``attnlab.cli.bench``). From Python::

    from attnlab.bench import BenchConfig, run_kernels, format_table
    report = run_kernels(BenchConfig(n=[1024], dtypes=["float32"], modes=["fwd"], masks=["window"]))
    text = format_table(report)
"""
import importlib

# Exports load on first use (PEP 562): ``python -m attnlab.bench.memory`` imports this package
# first, and an eager import of ``memory`` here would make runpy warn about running it twice.
_EXPORTS = {"MASK_KINDS": "cases", "MODES": "cases", "Case": "cases", "allowed_pairs": "cases",
            "useful_flops": "cases", "QUICK": "kernels", "BenchConfig": "kernels", "run_kernels": "kernels",
            "measure_peak": "memory", "fit_power_law": "memory", "extrapolate": "memory",
            "format_table": "report", "write_json": "report", "ScalingConfig": "scaling",
            "run_memory_scaling": "scaling", "format_scaling": "scaling"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


def __dir__():
    return sorted(list(globals()) + __all__)
