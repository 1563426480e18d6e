"""Memory that extension modules allocate with plain ``malloc``, which Python's allocator hooks
never see: OpenSSL's hash contexts behind ``hashlib`` objects.

    python examples/native.py

traces the same program twice: without native mode the contexts' memory is missing; with
``start(native=True)`` it is charged to the line that made the objects, in the ``native``
domain (see docs/native.md).
"""

import hashlib

import alloctrace


def make_digests(n):
    return [hashlib.sha256(b"payload %d" % i) for i in range(n)]


for native in (False, True):
    alloctrace.start(1, native=native)
    digests = make_digests(2000)
    snapshot = alloctrace.take_snapshot()
    alloctrace.stop()
    mine = snapshot.filter_traces([alloctrace.Filter(True, __file__)])
    print(f"native={native}:")
    for stat in mine.statistics("lineno")[:2]:
        print(" ", stat)
    only = mine.filter_traces([alloctrace.DomainFilter(True, "native")])
    size = sum(stat.size for stat in only.statistics("lineno"))
    print(f"  of which in the native domain: {size / 1024:.0f} KiB")
    del digests
