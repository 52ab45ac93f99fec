"""Wall-clock timing: moved to ``attnlab.measure.timing`` (issue #29: one measurement package under
both the bench and the lab). The old path still works: each name is the new module's own object,
with a DeprecationWarning.

Example::

    from attnlab.bench.timing import time_median
    # DeprecationWarning: attnlab.bench.timing.time_median is deprecated: it is now attnlab.measure.timing.time_median
"""
from ..deprecation import moved
from ..measure import timing as _new

__all__ = list(_new.__all__)
__getattr__ = moved(__name__, _new)    # PEP 562: asked only for names this module does not define


def __dir__():
    return sorted(list(globals()) + __all__)
