"""Blocks extensions report with PyTraceMalloc_Track/Untrack: recorded in their domain with the
caller's traceback, as tracemalloc records them, for extensions loaded before and after
start(); and the faults around the import-table rewriting (unknown blocks, blocks from before
start(), fork, dlclose, stop() racing a call).

The extension is tests/data/trackext.c, compiled here against this interpreter's headers.
"""

import ctypes
import gc
import sys
import textwrap
import threading

import pytest

import alloctrace
import cext
from subproc import run_python

DOMAIN = 7

pytestmark = cext.needs_cc
CC = cext.CC


def build(directory, name, flags=()):
    return cext.build("trackext.c", directory, name, flags, ())


load = cext.load


# Lazy binding (PLT slot), full RELRO (read-only GOT, rewritten under mprotect), and no PLT
# at all (GLOB_DAT slots read by the call sites).
LINKS = {
    "lazy": ["-Wl,-z,lazy"],
    "relro-now": ["-Wl,-z,relro,-z,now"],
    "no-plt": ["-fno-plt", "-Wl,-z,relro,-z,now"],
}


@pytest.fixture(scope="module")
def ext_before(tmp_path_factory):
    """An extension imported before any test starts tracing."""
    return load(build(tmp_path_factory.mktemp("before"), "trackext_before"), "trackext_before")


def here():
    return sys._getframe(1).f_lineno


def traces_in(domain):
    return [t for t in alloctrace._get_traces() if t[0] == domain]


def consistent():
    """The current total is the sum of the live traces (no corruption), up to what listing
    them allocates in between."""
    before = alloctrace.get_traced_memory()[0]
    total = sum(t[1] for t in alloctrace._get_traces())
    after, peak = alloctrace.get_traced_memory()
    slack = 64 * 1024
    return min(before, after) - slack <= total <= max(before, after) + slack and peak >= after


def test_extension_imported_before_start(stopped_tracer, ext_before):
    alloctrace.start(5)
    before = alloctrace.get_traced_memory()[0]
    line = here() + 1
    ptr = ext_before.alloc(DOMAIN, 12345)
    (trace,) = traces_in(DOMAIN)
    assert trace[1] == 12345
    assert trace[2][0] == (__file__, line)
    assert alloctrace.get_traced_memory()[0] - before >= 12345
    snapshot = alloctrace.take_snapshot()
    only = snapshot.filter_traces([alloctrace.DomainFilter(True, DOMAIN)])
    (stat,) = only.statistics("lineno")
    assert (stat.size, stat.count) == (12345, 1)
    assert stat.traceback[0].lineno == line
    assert [t.domain for t in only.traces] == [DOMAIN]
    without = snapshot.filter_traces([alloctrace.DomainFilter(False, DOMAIN)])
    assert all(t.domain != DOMAIN for t in without.traces)
    ext_before.release(DOMAIN, ptr)
    assert traces_in(DOMAIN) == []
    assert consistent()


def test_peak_snapshot_keeps_each_domain(stopped_tracer, ext_before, tmp_path):
    """At the peak, tracked blocks are in the domain they were reported in, as in a snapshot
    taken then: one traceback's blocks in two domains stay two traces."""
    alloctrace.start(1)
    line = here() + 1
    ptrs = [(d, ext_before.alloc(d, 2_000_000 + d)) for d in (DOMAIN, DOMAIN + 1)]
    big = here() + 1
    ptr = ext_before.alloc(DOMAIN, 3_000_000)
    at_peak = alloctrace.take_snapshot()
    for domain, p in [*ptrs, (DOMAIN, ptr)]:
        ext_before.release(domain, p)
    assert traces_in(DOMAIN) == []
    peak = alloctrace.take_snapshot(peak=True)
    path = str(tmp_path / "peak.snap")
    peak.dump(path)

    def tracked(snapshot):
        return sorted(
            (t.domain, t.size, t.traceback[0].lineno) for t in snapshot.traces if t.domain != 0
        )

    want = [
        (DOMAIN, 2_000_000 + DOMAIN, line),
        (DOMAIN, 3_000_000, big),
        (DOMAIN + 1, 2_000_000 + DOMAIN + 1, line),
    ]
    assert tracked(at_peak) == want
    for snapshot in (peak, alloctrace.Snapshot.load(path)):
        assert tracked(snapshot) == want
        only = snapshot.filter_traces([alloctrace.DomainFilter(True, DOMAIN + 1)])
        assert [(s.size, s.count) for s in only.statistics("lineno")] == [
            (2_000_000 + DOMAIN + 1, 1)
        ]
        zero = snapshot.filter_traces([alloctrace.DomainFilter(True, 0)])
        assert max(t.size for t in zero.traces) < 1_000_000
    # Grouped across domains, as tracemalloc groups: one line, both tracked domains.
    tracked_only = peak.filter_traces([alloctrace.DomainFilter(False, 0)])
    (stat,) = [s for s in tracked_only.statistics("lineno") if s.traceback[0].lineno == line]
    assert (stat.size, stat.count) == (4_000_000 + 2 * DOMAIN + 1, 2)


def test_domains_past_the_limit_are_dropped_until_clear(stopped_tracer, ext_before):
    """Each domain holding blocks has its own peak counters, 64 at most (0 and native's
    among them) between two clear_traces(): a block of one more is refused and counted."""
    alloctrace.start(1)
    ptr = 0x7F30_0000_0000
    codes = [ext_before.track(domain, ptr, 16) for domain in range(1000, 1070)]
    assert codes == [0] * 62 + [-1] * 8
    assert alloctrace._native.get_dropped_traces() == 8
    assert len([t for t in alloctrace._get_traces() if t[0] >= 1000]) == 62
    assert ext_before.track(1000, ptr + 16, 16) == 0, "a domain that has a space"
    alloctrace.clear_traces()
    assert ext_before.track(1069, ptr, 16) == 0
    assert [t[0] for t in alloctrace._get_traces() if t[0] >= 1000] == [1069]
    assert ext_before.untrack(1069, ptr) == 0
    assert consistent()


@pytest.mark.parametrize("link", sorted(LINKS))
def test_extension_built_and_imported_after_start(stopped_tracer, tmp_path, link):
    alloctrace.start(1)
    name = "trackext_after_" + link.replace("-", "_")
    ext = load(build(tmp_path, name, LINKS[link]), name)
    line = here() + 1
    ptr = ext.alloc(DOMAIN, 777)
    assert [(t[1], t[2][0]) for t in traces_in(DOMAIN)] == [(777, (__file__, line))]
    ext.release(DOMAIN, ptr)
    assert traces_in(DOMAIN) == []
    alloctrace.stop()
    # Back to CPython's own function, which ignores the call (-2: tracemalloc not tracing).
    assert ext.track(DOMAIN, 0x1000, 10) == -2


def test_retrack_replaces_and_untrack_of_unknown_is_a_noop(stopped_tracer, ext_before):
    alloctrace.start(1)
    ptr = 0x7F00_0000_1000
    # Sizes large next to what the test's own Python code allocates in between (< 1 KiB).
    assert ext_before.track(DOMAIN, ptr, 100_000) == 0
    assert ext_before.track(DOMAIN + 1, ptr, 30_000) == 0  # same address, other domain
    current = alloctrace.get_traced_memory()[0]
    assert ext_before.track(DOMAIN, ptr, 40_000) == 0
    assert abs(alloctrace.get_traced_memory()[0] - (current - 60_000)) < 1024
    assert sorted((t[0], t[1]) for t in alloctrace._get_traces() if t[0]) == [
        (DOMAIN, 40_000),
        (DOMAIN + 1, 30_000),
    ]
    current = alloctrace.get_traced_memory()[0]
    # Never tracked, wrong domain, already untracked: nothing changes.
    assert ext_before.untrack(DOMAIN, ptr + 16) == 0
    assert ext_before.untrack(DOMAIN + 2, ptr) == 0
    assert abs(alloctrace.get_traced_memory()[0] - current) < 1024
    assert ext_before.untrack(DOMAIN, ptr) == 0
    assert ext_before.untrack(DOMAIN, ptr) == 0
    assert [(t[0], t[1]) for t in alloctrace._get_traces() if t[0]] == [(DOMAIN + 1, 30_000)]
    assert abs(alloctrace.get_traced_memory()[0] - (current - 40_000)) < 1024
    assert consistent()


def test_tracer_memory_counts_the_tracked_blocks(stopped_tracer, ext_before):
    alloctrace.start(1)
    n, base = 20_000, 0x7F10_0000_0000
    before = alloctrace.get_tracemalloc_memory()
    for i in range(n):
        ext_before.track(DOMAIN, base + 16 * i, 64)
    grown = alloctrace.get_tracemalloc_memory() - before
    # Each entry is a (domain, address) key and a trace: at least 24 bytes, plus the
    # map's slack. All calls share one traceback, so nothing else grows by as much.
    assert grown >= n * 24, grown
    for i in range(n):
        ext_before.untrack(DOMAIN, base + 16 * i)
    alloctrace.clear_traces()
    assert alloctrace.get_tracemalloc_memory() < before + n * 24


def test_domain_zero_is_the_hooks_domain(stopped_tracer, ext_before):
    """Track(0, ..) adds to (or replaces in) the hooks' own traces and Untrack(0, ..) removes
    from them, as numpy 2.5 relies on to move its PyMem_RawMalloc'd buffers to its domain."""
    alloctrace.start(1)
    data = bytearray(100_000)
    address = next(t for t in alloctrace._get_traces() if t[1] >= 100_000 and t[0] == 0)
    assert address  # the buffer is traced in domain 0
    before = alloctrace.get_traced_memory()[0]
    buffer_ptr = ctypes.addressof(ctypes.c_char.from_buffer(data))
    # bytearray's buffer is its own block: untrack it from domain 0, track it in another.
    assert ext_before.untrack(0, buffer_ptr) == 0
    assert alloctrace.get_traced_memory()[0] < before - 99_000
    assert ext_before.track(DOMAIN, buffer_ptr, 100_001) == 0
    assert [t[1] for t in traces_in(DOMAIN)] == [100_001]
    assert not [t for t in traces_in(0) if t[1] == 100_001]
    fake = 0x7F00_0000_2000
    line = here() + 1
    assert ext_before.track(0, fake, 4242) == 0
    assert [(t[1], t[2][0]) for t in traces_in(0) if t[1] == 4242] == [(4242, (__file__, line))]
    assert ext_before.untrack(0, fake) == 0
    assert not [t for t in traces_in(0) if t[1] == 4242]
    assert ext_before.untrack(DOMAIN, buffer_ptr) == 0
    del data
    assert consistent()


def test_domain_zero_calls_on_a_block_just_allocated(stopped_tracer, ext_before):
    """Track(0, ..) and Untrack(0, ..) of a block the hooks recorded a moment ago, with
    nothing read in between (the tracer files such a block in its table late): the call
    replaces or removes the hooks' trace, never leaving a second one."""
    alloctrace.start(1)
    before = alloctrace.get_traced_memory()[0]
    data = bytearray(100_000)
    buffer_ptr = ctypes.addressof(ctypes.c_char.from_buffer(data))
    assert ext_before.untrack(0, buffer_ptr) == 0
    assert alloctrace.get_traced_memory()[0] < before + 50_000
    assert not [t for t in traces_in(0) if t[1] >= 100_000]
    other = bytearray(200_000)
    other_ptr = ctypes.addressof(ctypes.c_char.from_buffer(other))
    assert ext_before.track(0, other_ptr, 4321) == 0
    assert alloctrace.get_traced_memory()[0] < before + 50_000
    assert [t[1] for t in traces_in(0) if t[1] in (4321, 200_000)] == [4321]
    assert ext_before.untrack(0, other_ptr) == 0
    del data, other
    assert consistent()


def test_blocks_from_before_start_and_after_stop(stopped_tracer, ext_before):
    old = ext_before.alloc(DOMAIN, 500)  # not tracing: CPython's function ignores it
    alloctrace.start(1)
    current = alloctrace.get_traced_memory()[0]
    ext_before.release(DOMAIN, old)  # Untrack of a block never recorded
    assert alloctrace.get_traced_memory()[0] == current
    kept = ext_before.alloc(DOMAIN, 600)
    alloctrace.stop()
    ext_before.release(DOMAIN, kept)  # freed after stop(): no trace left to touch
    alloctrace.start(1)
    assert traces_in(DOMAIN) == []
    assert consistent()


def test_disable_and_trace_filters_apply(stopped_tracer, ext_before):
    alloctrace.start(1)
    alloctrace.disable()
    ptr = ext_before.alloc(DOMAIN, 64)
    assert traces_in(DOMAIN) == []
    alloctrace.enable()
    ext_before.release(DOMAIN, ptr)
    alloctrace.add_filter(alloctrace.DomainFilter(False, DOMAIN))
    ptr = ext_before.alloc(DOMAIN, 64)
    other = ext_before.alloc(DOMAIN + 1, 64)
    assert traces_in(DOMAIN) == []
    assert [t[1] for t in traces_in(DOMAIN + 1)] == [64]
    ext_before.release(DOMAIN, ptr)
    ext_before.release(DOMAIN + 1, other)


def test_standard_module_sees_the_calls_after_stop(stopped_tracer, ext_before):
    import tracemalloc

    alloctrace.start(1)
    alloctrace.stop()
    tracemalloc.start()
    try:
        ptr = ext_before.alloc(DOMAIN, 999)
        traces = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, DOMAIN)])
        assert [t.size for t in traces.traces] == [999]
        ext_before.release(DOMAIN, ptr)
    finally:
        tracemalloc.stop()


def test_dlclose_of_a_redirected_library(stopped_tracer, tmp_path):
    import _ctypes

    path = build(tmp_path, "trackext_closed")
    alloctrace.start(1)
    lib = ctypes.PyDLL(path)
    lib.at_track.argtypes = [ctypes.c_uint, ctypes.c_size_t, ctypes.c_size_t]
    lib.at_untrack.argtypes = [ctypes.c_uint, ctypes.c_size_t]
    assert lib.at_track(DOMAIN, 0x5000, 321) == 0
    assert [t[1] for t in traces_in(DOMAIN)] == [321]
    handle = lib._handle
    del lib
    gc.collect()
    _ctypes.dlclose(handle)
    alloctrace.stop()  # restores slots: the closed library must not be written
    alloctrace.start(1)
    lib = ctypes.PyDLL(path)  # loaded again, redirected again
    lib.at_track.argtypes = [ctypes.c_uint, ctypes.c_size_t, ctypes.c_size_t]
    assert lib.at_track(DOMAIN, 0x6000, 123) == 0
    assert [t[1] for t in traces_in(DOMAIN)] == [123]
    assert consistent()


def test_stop_while_other_threads_are_inside_the_calls(stopped_tracer, ext_before):
    """Threads call Track/Untrack without the GIL while the main thread starts and stops:
    no crash, and the table stays consistent."""
    alloctrace.start(1)
    workers = [
        threading.Thread(target=ext_before.hammer, args=(DOMAIN + k, 20_000)) for k in range(3)
    ]
    for w in workers:
        w.start()
    for _ in range(30):
        alloctrace.stop()
        alloctrace.start(1)
    for w in workers:
        w.join()
    assert traces_in(DOMAIN) == [] and consistent()


def test_fork_while_redirected(tmp_path):
    ext = build(tmp_path, "trackext_fork")
    script = textwrap.dedent(
        f"""
        import importlib.util, os, threading
        import alloctrace
        spec = importlib.util.spec_from_file_location("trackext_fork", {ext!r})
        ext = importlib.util.module_from_spec(spec); spec.loader.exec_module(ext)
        alloctrace.start(1)
        t = threading.Thread(target=ext.hammer, args=(7, 50_000)); t.start()
        pids = []
        for _ in range(5):
            pid = os.fork()
            if pid == 0:
                p = ext.alloc(9, 4096)
                ok = [tr[1] for tr in alloctrace._get_traces() if tr[0] == 9] == [4096]
                ext.release(9, p)
                ok = ok and not [tr for tr in alloctrace._get_traces() if tr[0] == 9]
                os._exit(0 if ok else 3)
            pids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
        t.join()
        p = ext.alloc(9, 100)
        assert [tr[1] for tr in alloctrace._get_traces() if tr[0] == 9] == [100]
        print(codes)
        """
    )
    result = run_python(["-c", script])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[0, 0, 0, 0, 0]"


def test_track_with_the_gil_released_names_the_calling_line(stopped_tracer, ext_before):
    # An extension that tracks a block in a section without the GIL, from the main thread and
    # from another: PyTraceMalloc_Track takes the GIL itself, as CPython's does, and the block
    # is on the Python line that called the extension, the caller's frame above it.
    alloctrace.start(5)

    def call(ptr):
        ext_before.track_released(DOMAIN, ptr, 4321)
        return here() - 1

    try:
        in_main = call(0x1000)
        called_main = here() - 1
        worker = threading.Thread(target=call, args=(0x2000,))
        worker.start()
        worker.join()
        stacks = sorted(t[2][:2] for t in traces_in(DOMAIN))
        assert len(stacks) == 2 and {stack[0] for stack in stacks} == {(__file__, in_main)}
        # The main thread's caller; the worker's is threading's run().
        assert (__file__, called_main) in {stack[1] for stack in stacks}
    finally:
        for ptr in (0x1000, 0x2000):
            ext_before.untrack(DOMAIN, ptr)
