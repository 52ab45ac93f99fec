"""Machine facts (versions, CPU, threads, load): moved to ``attnlab.measure.machine`` (issue #29: one
measurement package under both the bench and the lab). The old path still works: each name is the new
module's own object, with a DeprecationWarning.

Example::

    from attnlab.bench.machine import machine_info
    # DeprecationWarning: attnlab.bench.machine.machine_info is deprecated:
    #                     it is now attnlab.measure.machine.machine_info
"""
from ..deprecation import moved
from ..measure import machine as _new

__all__ = list(_new.__all__)
__getattr__ = moved(__name__, _new)    # PEP 562: asked only for names this module does not define


def __dir__():
    return sorted(list(globals()) + __all__)
