"""Trace memory allocations, like :mod:`tracemalloc`, at a fraction of its cost.

(in progress: the runtime API only)
"""

from alloctrace._native import (  # noqa: F401
    clear_traces,
    get_traceback_limit,
    get_traced_memory,
    get_tracemalloc_memory,
    is_tracing,
    reset_peak,
    start,
    stop,
)
from alloctrace._native import get_object_traceback as _get_object_traceback  # noqa: F401
from alloctrace._native import get_traces as _get_traces  # noqa: F401
