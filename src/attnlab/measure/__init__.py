"""What the benchmarks and the lab measure with: wall time, peak memory, the machine, the thread count.

One concern per module:

    timing    warm-up + median timing, round-robin timing of several functions, this machine's GEMM peak
    machine   versions, CPU and threads stored with every result; how busy other processes kept the machine
    threads   ``threads(n)``: run a block on n torch threads, then restore the count

Its floor (issue #29, ``tests/test_imports.py``'s ``FLOORS``) is just below ``attnlab.bench`` and above
``attnlab.tasks``: ``bench`` and ``lab`` both stand on it, and it imports only ``attnlab.functional`` (the
CPU class, the compiled kernel's level), so a timing helper never drags in a benchmark or an experiment.
Peak memory stays in ``attnlab.bench.memory``: its child process runs a bench contestant on a bench case.

Nothing is imported here: import the module you need.

Example::

    from attnlab.measure.timing import time_interleaved
    from attnlab.measure.threads import threads
    with threads(1):
        ta, tb = time_interleaved([f, g])
"""
