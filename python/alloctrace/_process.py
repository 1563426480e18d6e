"""The process's resident memory as the kernel reports it, to set beside the traced total.

Traced bytes are what the program asked the allocators for and still holds; the resident set
size (RSS) is every page of the process present in RAM, whoever mapped it. The difference is
allocator caches and fragmentation, pymalloc's arenas, the code of the interpreter and its
libraries, and memory mapped without a traced allocator. docs/process-memory.md has a worked
example.
"""

from __future__ import annotations

from collections import namedtuple

from alloctrace import _native

# collections.namedtuple rather than typing.NamedTuple: importing alloctrace must not load
# typing, or a program that imports it after start() is charged less than under tracemalloc
# (_process.pyi gives the field types).
ProcessMemory = namedtuple("ProcessMemory", "rss anon file shmem peak_rss")
ProcessMemory.__doc__ = """Resident memory of the process in bytes, from ``/proc/self/status``.

*rss* (``VmRSS``) is the sum of *anon* (``RssAnon``: heaps, arenas, anonymous mappings,
stacks), *file* (``RssFile``: the executable, libraries and mapped files) and *shmem*
(``RssShmem``: shared memory). *peak_rss* (``VmHWM``) is the highest RSS so far.
"""


def get_process_memory() -> ProcessMemory:
    """Return the process's resident memory now, as a :class:`ProcessMemory`.

    Works whether or not tracing is on. Compare ``get_traced_memory()[0]`` with the *rss*
    field to see how much of the process's memory the tracer accounts for. Raises
    :exc:`OSError` where ``/proc/self/status`` cannot be read (outside Linux).
    """
    return ProcessMemory(*_native.get_process_memory())


def _from_native(figures) -> ProcessMemory | None:
    return None if figures is None else ProcessMemory(*figures)
