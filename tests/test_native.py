"""Native mode (start(native=True)): extensions' own malloc-family and anonymous mmap calls,
recorded in alloctrace.NATIVE_DOMAIN with the caller's traceback, never counting the
interpreter's own blocks twice; and the faults around the import-table rewriting (blocks from
before start(), unknown frees and reallocs, fork, dlclose, stop() racing the hooks).

The extension is tests/data/nativeext.c, compiled here against this interpreter's headers.
"""

import ctypes
import gc
import subprocess
import sys
import textwrap
import threading

import pytest

import alloctrace
import cext
from subproc import run_python

NATIVE = alloctrace.NATIVE_DOMAIN
NUMPY_DOMAIN = 389047

pytestmark = cext.needs_cc
CC = cext.CC


def build(directory, name, flags=()):
    return cext.build("nativeext.c", directory, name, flags, ("-lpthread",))


load = cext.load


def child_script(path, name, body):
    """A child's script: alloctrace imported, then the extension built at *path* loaded as
    ``ext`` under module name *name*, then *body* (dedented)."""
    return (
        "import importlib.util\n"
        "import alloctrace\n"
        f"spec = importlib.util.spec_from_file_location({name!r}, {path!r})\n"
        "ext = importlib.util.module_from_spec(spec); spec.loader.exec_module(ext)\n"
        + textwrap.dedent(body)
    )


@pytest.fixture(scope="module")
def ext(tmp_path_factory):
    """An extension imported before any test starts tracing."""
    return load(build(tmp_path_factory.mktemp("before"), "nativeext_before"), "nativeext_before")


def here():
    return sys._getframe(1).f_lineno


def native_traces():
    return [t for t in alloctrace._get_traces() if t[0] == NATIVE]


def sizes():
    return sorted(t[1] for t in native_traces())


def consistent():
    """The current total is the sum of the live traces, up to what listing them allocates."""
    before = alloctrace.get_traced_memory()[0]
    total = sum(t[1] for t in alloctrace._get_traces())
    after, peak = alloctrace.get_traced_memory()
    slack = 64 * 1024
    return min(before, after) - slack <= total <= max(before, after) + slack and peak >= after


ALLOCATORS = {
    "malloc": lambda ext: (ext.malloc(10001), 10001),
    "calloc": lambda ext: (ext.calloc(7, 1429), 10003),
    "posix_memalign": lambda ext: (ext.posix_memalign(64, 10005), 10005),
    "aligned_alloc": lambda ext: (ext.aligned_alloc(64, 10048), 10048),
    "memalign": lambda ext: (ext.memalign(256, 10007), 10007),
    "valloc": lambda ext: (ext.valloc(10009), 10009),
}


@pytest.mark.parametrize("function", sorted(ALLOCATORS))
def test_each_allocator_is_recorded_with_its_line(stopped_tracer, ext, function):
    alloctrace.start(5, native=True)
    line = here() + 1
    ptr, size = ALLOCATORS[function](ext)
    assert ptr
    (trace,) = [t for t in native_traces() if t[1] == size]
    assert trace[2][1] == (__file__, line)  # under the lambda's frame
    ext.free(ptr)
    assert [t for t in native_traces() if t[1] == size] == []
    assert consistent()


def test_off_by_default_and_one_mode_per_session(stopped_tracer, ext):
    alloctrace.start(1)
    assert not alloctrace.is_tracing_native()
    ptr = ext.malloc(54321)
    assert 54321 not in sizes()
    ext.free(ptr)
    with pytest.raises(RuntimeError, match="without native allocations"):
        alloctrace.start(1, native=True)
    alloctrace.start(1)  # a no-op, as in tracemalloc
    alloctrace.stop()
    assert alloctrace._native._native_redirected_slots() == 0
    alloctrace.start(1, native=True)
    assert alloctrace.is_tracing_native()
    assert alloctrace._native._native_redirected_slots() > 0
    alloctrace.start(1)  # None: whatever is running
    assert alloctrace.is_tracing_native()
    with pytest.raises(RuntimeError, match="with native allocations"):
        alloctrace.start(1, native=False)
    alloctrace.stop()
    assert not alloctrace.is_tracing_native()
    assert alloctrace._native._native_redirected_slots() == 0


def test_realloc_free_and_blocks_from_before_start(stopped_tracer, ext):
    old = ext.malloc(3000)  # before start(): unknown to the tracer
    also_old = ext.malloc(4000)
    alloctrace.start(1, native=True)
    ext.free(also_old)  # a free of an unknown block: ignored
    line = here() + 1
    moved = ext.realloc(old, 5000)  # a realloc of an unknown block: the new block is traced
    assert [(t[1], t[2][0][1]) for t in native_traces() if t[1] == 5000] == [(5000, line)]
    ptr = ext.malloc(6000)
    line = here() + 1
    ptr = ext.realloc(ptr, 7000)
    assert 6000 not in sizes()
    assert [t[2][0][1] for t in native_traces() if t[1] == 7000] == [line]
    ext.realloc(ptr, 0)  # glibc frees the block (and returns NULL)
    assert 7000 not in sizes()
    ext.free(moved)
    assert 5000 not in sizes()
    ext.free(0)
    assert consistent()


def test_free_of_a_pymem_raw_block_forgets_it(stopped_tracer, ext):
    """A block from PyMem_RawMalloc (domain 0, by the PEP 445 hook) given back with free():
    counted once, in domain 0, and forgotten when freed."""
    alloctrace.start(1, native=True)
    ptr = ext.pymem_raw_malloc(77777)
    assert [t[0] for t in alloctrace._get_traces() if t[1] == 77777] == [0]
    ext.free(ptr)
    assert [t for t in alloctrace._get_traces() if t[1] == 77777] == []


def test_mmap_munmap_mremap(stopped_tracer, ext, tmp_path):
    alloctrace.start(1, native=True)
    page = 4096
    ptr = ext.mmap(10 * page)
    assert (10 * page) in sizes()
    # Unmapping the head leaves the tail traced.
    assert ext.munmap(ptr, 3 * page) == 0
    assert (10 * page) not in sizes() and (7 * page) in sizes()
    tail = ptr + 3 * page
    moved = ext.mremap(tail, 7 * page, 20 * page)
    assert moved
    assert (7 * page) not in sizes() and (20 * page) in sizes()
    assert ext.munmap(moved, 20 * page) == 0
    assert (20 * page) not in sizes()
    # File mappings are not allocations.
    path = tmp_path / "data"
    path.write_bytes(b"x" * (5 * page))
    with open(path, "rb") as f:
        mapped = ext.mmap_file(f.fileno(), 5 * page)
    assert mapped and (5 * page) not in sizes()
    assert ext.mremap(mapped, 5 * page, 6 * page) != 0
    assert (6 * page) not in sizes()
    assert consistent()


def test_partial_munmap_leaves_only_the_mapped_pieces_traced(stopped_tracer, ext):
    """Issue 61 item 10: unmapping the tail or the middle of a traced mapping (or a range
    across two mappings) keeps exactly the pieces still mapped traced, with their traceback."""
    alloctrace.start(1, native=True)
    page = 4096
    ptr = ext.mmap(1024 * page)  # 4 MiB
    line = here() - 1
    assert sizes() == [1024 * page]
    assert ext.munmap(ptr + 1000 * page, 24 * page) == 0  # the tail
    assert sizes() == [1000 * page]
    assert ext.munmap(ptr + 100 * page, 200 * page) == 0  # the middle
    assert sizes() == [100 * page, 700 * page]
    assert ext.munmap(ptr + 50 * page, 300 * page) == 0  # the end of one, the start of another
    assert sizes() == [50 * page, 650 * page]
    assert {t[2][0][1] for t in native_traces()} == {line}
    # A length that is not a multiple of the page size unmaps whole pages.
    assert ext.munmap(ptr + 400 * page, 10 * page - 100) == 0
    assert sizes() == [50 * page, 50 * page, 590 * page]
    # One call over every piece and the holes between them.
    assert ext.munmap(ptr, 1024 * page) == 0
    assert sizes() == []
    assert consistent()


def test_without_the_gil_the_calling_line_without_python_unknown(stopped_tracer, ext):
    """A thread that released the GIL is charged on its Python stack, as it stood when it
    released it (issue 56); a thread started in C, with no Python thread state, gets
    ``<unknown>`` as in tracemalloc."""
    alloctrace.start(3, native=True)
    a = ext.malloc_in_thread(12121)
    line = here() + 1
    b = ext.malloc_nogil(13131)
    found = {t[1]: t[2] for t in native_traces() if t[1] in (12121, 13131)}
    assert found[12121] == (("<unknown>", 0),)
    assert found[13131][0] == (__file__, line)
    assert len(found[13131]) == 3
    ext.free(a)
    ext.free(b)
    assert not [t for t in native_traces() if t[1] in (12121, 13131)]


def test_interpreter_blocks_are_not_counted_twice(stopped_tracer, ext):
    alloctrace.start(1, native=True)
    data = bytearray(3_000_017)
    ptr = ext.pymem_raw_malloc(2_000_029)
    traces = alloctrace._get_traces()
    assert [t[0] for t in traces if t[1] >= 3_000_017] == [0]
    assert [t[0] for t in traces if t[1] == 2_000_029] == [0]
    assert not [t for t in traces if t[0] == NATIVE and t[1] >= 1_000_000]
    ext.free(ptr)
    del data


def test_tracked_block_leaves_the_native_domain(stopped_tracer, ext):
    """numpy on 3.9-3.11 mallocs array data, then reports it with PyTraceMalloc_Track: the
    block is counted once, in the reported domain."""
    alloctrace.start(1, native=True)
    ptr = ext.malloc(88888)
    assert 88888 in sizes()
    assert ext.track(NUMPY_DOMAIN, ptr, 88888) == 0
    traces = [t for t in alloctrace._get_traces() if t[1] == 88888]
    assert [t[0] for t in traces] == [NUMPY_DOMAIN]
    assert ext.untrack(NUMPY_DOMAIN, ptr) == 0
    ext.free(ptr)
    assert not [t for t in alloctrace._get_traces() if t[1] == 88888]
    assert consistent()


def test_snapshot_domain_filter_statistics_and_dump(stopped_tracer, ext, tmp_path):
    alloctrace.start(1, native=True)
    line = here() + 1
    ptr = ext.malloc(250_000)
    snapshot = alloctrace.take_snapshot()
    ext.free(ptr)
    native = snapshot.filter_traces([alloctrace.DomainFilter(True, "native")])
    assert alloctrace.DomainFilter(True, "native").domain == NATIVE
    (stat,) = [s for s in native.statistics("lineno") if s.size == 250_000]
    assert (stat.count, stat.traceback[0].lineno) == (1, line)
    assert {t.domain for t in native.traces} == {NATIVE}
    without = snapshot.filter_traces([alloctrace.DomainFilter(False, "native")])
    assert NATIVE not in {t.domain for t in without.traces}
    path = str(tmp_path / "native.snap")
    snapshot.dump(path)
    loaded = alloctrace.Snapshot.load(path)
    again = loaded.filter_traces([alloctrace.DomainFilter(True, NATIVE)])
    assert [s.size for s in again.statistics("lineno")] == [
        s.size for s in native.statistics("lineno")
    ]
    with pytest.raises(TypeError, match="domain must be an int or a domain name .*'natve'"):
        alloctrace.DomainFilter(True, "natve")


def test_peak_snapshot_keeps_native_blocks_in_their_domain(stopped_tracer, ext):
    alloctrace.start(1, native=True)
    line = here() + 1
    ptr = ext.malloc(6_000_000)
    at_peak = alloctrace.take_snapshot()
    ext.free(ptr)
    peak = alloctrace.take_snapshot(peak=True)

    def big(snapshot):
        return [(t.domain, t.size, t.traceback[0].lineno) for t in snapshot.traces if t.size >= 1e6]

    assert big(at_peak) == big(peak) == [(NATIVE, 6_000_000, line)]
    native = peak.filter_traces([alloctrace.DomainFilter(True, "native")])
    assert max(s.size for s in native.statistics("lineno")) == 6_000_000
    without = peak.filter_traces([alloctrace.DomainFilter(False, "native")])
    assert big(without) == []


def test_trace_time_domain_filter_drops_native_blocks(stopped_tracer, ext):
    alloctrace.add_filter(alloctrace.DomainFilter(False, "native"))
    alloctrace.start(1, native=True)
    a = ext.malloc(31313)
    b = ext.malloc_in_thread(32323)  # <unknown>: judged in the native domain too
    c = ext.malloc_nogil(33333)  # without the GIL: judged when settled
    assert not native_traces()
    ext.free(a)
    ext.free(b)
    ext.free(c)


# Pointers to the allocator kept in a library's data, filled by the loader (R_X86_64_64
# relocations), as libxml2's xmlMalloc/xmlFree: nativeext.c's data_* (writable) and ro_*
# (under RELRO) pointers, and offset_malloc (malloc's address + 16: never rewritten).
REWRITTEN = ("malloc", "calloc", "realloc", "free", "ro_malloc", "ro_free")


def test_allocator_pointers_in_library_data_are_redirected(stopped_tracer, ext):
    before = ext.data_pointers()
    alloctrace.start(1, native=True)
    during = ext.data_pointers()
    for name in REWRITTEN:
        assert during[name] != before[name], name
    assert during["offset_malloc"] == before["offset_malloc"]
    assert during["malloc"] == during["ro_malloc"]  # the same hook: comparisons still hold
    line = here() + 1
    a, b, c = ext.data_malloc(31001), ext.data_malloc(31002, True), ext.data_calloc(3, 10001)
    traced = {t[1]: t[2][0][1] for t in native_traces() if 30000 < t[1] < 31003}
    assert traced == {31001: line, 31002: line, 30003: line}
    line = here() + 1
    a = ext.data_realloc(a, 31007)
    assert {t[1]: t[2][0][1] for t in native_traces() if t[1] in (31001, 31007)} == {31007: line}
    ext.data_free(a)
    ext.data_free(b, True)
    ext.data_free(c)
    assert [t for t in native_traces() if 30000 < t[1] < 31010] == []
    assert consistent()
    alloctrace.stop()
    assert ext.data_pointers() == before
    assert alloctrace._native._native_redirected_slots() == 0


def test_blocks_crossing_the_switch_of_a_data_pointer(stopped_tracer, ext):
    """A block allocated through the real function and freed through the hook (and the
    reverse, across stop()) is harmless: an unknown free is a miss, and stop() cleared the
    table before the real free sees a block the hook recorded."""
    old = ext.data_malloc(32001)
    alloctrace.start(1, native=True)
    ext.data_free(old)  # unknown to the tracer: ignored
    ptr = ext.data_malloc(32002)
    moved = ext.data_realloc(ext.data_malloc(10), 32003)
    assert {32002, 32003} <= set(sizes())
    alloctrace.stop()
    ext.data_free(ptr)  # the real free, of a block the hook recorded
    alloctrace.start(1, native=True)
    assert 32002 not in sizes()
    ext.data_free(moved)
    assert 32003 not in sizes()
    assert consistent()
    alloctrace.stop()


def test_a_pointer_the_library_changed_is_left_alone(stopped_tracer, ext):
    before = ext.data_pointers()
    alloctrace.start(1, native=True)
    hook = ext.set_data_malloc(0)  # the library installs its own allocator meanwhile
    assert hook != before["malloc"]
    alloctrace.stop()
    after = ext.data_pointers()
    assert after["malloc"] == before["own_malloc"]  # not put back
    assert {name: after[name] for name in REWRITTEN[1:]} == {
        name: before[name] for name in REWRITTEN[1:]
    }
    assert alloctrace._native._native_redirected_slots() == 0
    # A pointer the library set to something else is not the process's allocator: never
    # rewritten either.
    alloctrace.start(1, native=True)
    assert ext.data_pointers()["malloc"] == before["own_malloc"]
    alloctrace.stop()
    ext.set_data_malloc(before["malloc"])
    assert ext.data_pointers() == before


def test_data_pointers_of_a_library_loaded_after_start(stopped_tracer, tmp_path):
    path = build(tmp_path, "nativeext_late_data")
    alloctrace.start(1, native=True)
    late = load(path, "nativeext_late_data")
    line = here() + 1
    ptr = late.data_malloc(33001, True)
    assert [t[2][0][1] for t in native_traces() if t[1] == 33001] == [line]
    alloctrace.stop()
    late.data_free(ptr, True)
    assert alloctrace._native._native_redirected_slots() == 0


def test_extension_loaded_after_start_is_redirected(stopped_tracer, tmp_path):
    alloctrace.start(1, native=True)
    late = load(build(tmp_path, "nativeext_late", ["-Wl,-z,lazy"]), "nativeext_late")
    line = here() + 1
    ptr = late.malloc(42424)
    assert [t[2][0][1] for t in native_traces() if t[1] == 42424] == [line]
    late.free(ptr)
    alloctrace.stop()
    assert alloctrace._native._native_redirected_slots() == 0


def test_dlclose_of_a_redirected_library(stopped_tracer, tmp_path):
    import _ctypes

    path = build(tmp_path, "nativeext_closed")
    alloctrace.start(1, native=True)
    lib = ctypes.PyDLL(path)
    ptr = load(path, "nativeext_closed").malloc(9999)
    assert 9999 in sizes()
    handle = lib._handle
    del lib
    gc.collect()
    _ctypes.dlclose(handle)  # the module keeps the library loaded: one reference less
    alloctrace.stop()
    alloctrace.start(1, native=True)
    assert 9999 not in sizes()
    assert consistent()
    alloctrace.stop()
    assert alloctrace._native._native_redirected_slots() == 0
    del ptr


def test_dlclose_unloads_a_redirected_library(stopped_tracer, tmp_path):
    """A plain shared library (not a module) that mallocs, closed for good while redirected:
    stop() must not write into its unmapped import table."""
    import _ctypes

    src = tmp_path / "plain.c"
    src.write_text("#include <stdlib.h>\nvoid *grab(size_t n) { return malloc(n); }\n")
    path = str(tmp_path / "libplain.so")
    subprocess.run([CC, "-shared", "-fPIC", str(src), "-o", path], check=True)
    alloctrace.start(1, native=True)
    lib = ctypes.CDLL(path)
    lib.grab.restype = ctypes.c_void_p
    lib.grab.argtypes = [ctypes.c_size_t]
    ptr = lib.grab(23232)
    assert 23232 in sizes()
    handle = lib._handle
    del lib
    _ctypes.dlclose(handle)
    assert not any(path in line for line in open("/proc/self/maps"))
    alloctrace.stop()
    assert alloctrace._native._native_redirected_slots() == 0
    ctypes.CDLL(None).free(ctypes.c_void_p(ptr))


def test_stop_while_other_threads_are_inside_malloc(stopped_tracer, ext):
    """Threads malloc/realloc/free without the GIL while the main thread stops and starts:
    no crash, slots restored, the table consistent."""
    alloctrace.start(1, native=True)
    workers = [threading.Thread(target=ext.churn, args=(1.5,)) for _ in range(3)]
    for w in workers:
        w.start()
    for k in range(60):
        alloctrace.stop()
        alloctrace.start(1, native=k % 2 == 0)
    for w in workers:
        w.join()
    assert consistent()
    alloctrace.stop()
    assert alloctrace._native._native_redirected_slots() == 0


def test_fork_while_redirected(tmp_path):
    path = build(tmp_path, "nativeext_fork")
    script = child_script(
        path,
        "nativeext_fork",
        """
        import os, threading
        alloctrace.start(1, native=True)
        t = threading.Thread(target=ext.churn, args=(1.0,)); t.start()
        native = lambda: [tr[1] for tr in alloctrace._get_traces()
                          if tr[0] == alloctrace.NATIVE_DOMAIN and tr[1] == 4097]
        pids = []
        for _ in range(5):
            pid = os.fork()
            if pid == 0:
                p = ext.malloc(4097)
                ok = native() == [4097]
                ext.free(p)
                ok = ok and native() == []
                os._exit(0 if ok else 3)
            pids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
        t.join()
        p = ext.malloc(4097)
        assert native() == [4097]
        print(codes)
        """,
    )
    result = run_python(["-c", script])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[0, 0, 0, 0, 0]"


def test_many_forks_while_threads_wait_for_the_table(tmp_path):
    """Forks for two seconds while three threads churn malloc/free: each fork holds the
    trace table's locks, so those threads wait for them at every fork. A waiter that parked
    in parking_lot_core left some children hung in their after-fork handler (the rare hang of
    test_fork_while_redirected). Each child gets 10 s; a hung one is killed and reported."""
    path = build(tmp_path, "nativeext_forks")
    script = child_script(
        path,
        "nativeext_forks",
        """
        import os, signal, threading, time
        alloctrace.start(1, native=True)
        threads = [threading.Thread(target=ext.churn, args=(2.0,)) for _ in range(3)]
        for t in threads:
            t.start()
        forks = 0
        while any(t.is_alive() for t in threads):
            pid = os.fork()
            if pid == 0:
                ext.free(ext.malloc(4097))
                os._exit(0)
            forks += 1
            deadline = time.monotonic() + 10
            while (status := os.waitpid(pid, os.WNOHANG)) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    print("child hung after", forks, "forks", flush=True)
                    os._exit(1)
                time.sleep(0.001)
            assert os.waitstatus_to_exitcode(status[1]) == 0, status
        for t in threads:
            t.join()
        print("forks", forks)
        """,
    )
    result = run_python(["-W", "ignore::DeprecationWarning", "-c", script])
    assert result.returncode == 0, result.stdout + result.stderr
    assert int(result.stdout.split()[-1]) > 0


def jemalloc():
    """The path of a jemalloc library to preload, or None."""
    import glob

    for pattern in ("/usr/lib/x86_64-linux-gnu/libjemalloc.so*", "/usr/lib*/libjemalloc.so*"):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


@pytest.mark.skipif(jemalloc() is None, reason="no libjemalloc to preload (Debian: libjemalloc2)")
def test_preloaded_jemalloc(tmp_path):
    """With jemalloc preloaded, the process's malloc is jemalloc's: the extension's calls and
    data pointers reach it through the hooks, and jemalloc's own mmap calls (its arenas, whose
    blocks the malloc hooks count) are not counted a second time. Stop/start cycles and a
    thread churning through the hooks meanwhile."""
    path = build(tmp_path, "nativeext_jemalloc")
    script = child_script(
        path,
        "nativeext_jemalloc",
        """
        import threading
        before = ext.data_pointers()
        alloctrace.start(1, native=True)
        native = lambda: sum(t[1] for t in alloctrace._get_traces()
                             if t[0] == alloctrace.NATIVE_DOMAIN)
        base = native()
        blocks = [ext.malloc(1 << 20) for _ in range(24)]
        blocks += [ext.data_malloc(1 << 20) for _ in range(24)]
        grown = native() - base
        assert 48 << 20 <= grown < 52 << 20, grown
        for b in blocks:
            ext.free(b)
        t = threading.Thread(target=ext.churn, args=(0.5,)); t.start()
        for k in range(20):
            alloctrace.stop()
            alloctrace.start(1, native=k % 2 == 0)
        t.join()
        alloctrace.stop()
        assert ext.data_pointers() == before
        assert alloctrace._native._native_redirected_slots() == 0
        print("ok", grown)
        """,
    )
    proc = run_python(["-c", script], LD_PRELOAD=jemalloc())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok"), proc.stdout


def test_startup_variable(tmp_path):
    path = build(tmp_path, "nativeext_env")
    script = child_script(
        path,
        "nativeext_env",
        """
        p = ext.malloc(65432)
        print(alloctrace.is_tracing_native(),
              [t[0] == alloctrace.NATIVE_DOMAIN for t in alloctrace._get_traces()
               if t[1] == 65432])
        """,
    )
    on = run_python(["-c", script], ALLOCTRACE="1", ALLOCTRACE_NATIVE="1")
    assert on.returncode == 0, on.stderr
    assert on.stdout.split() == ["True", "[True]"]
    # Alone it implies ALLOCTRACE=1 (as docs/startup.md says).
    alone = run_python(["-c", script], ALLOCTRACE_NATIVE="1")
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.split() == ["True", "[True]"]
    off = run_python(["-c", script], ALLOCTRACE="1")
    assert off.stdout.split() == ["False", "[]"], off.stderr
    bad = run_python(["-c", "pass"], ALLOCTRACE="1", ALLOCTRACE_NATIVE="yes")
    assert bad.returncode != 0 and "ALLOCTRACE_NATIVE" in bad.stderr


def test_numpy_counts_each_block_once(stopped_tracer):
    np = pytest.importorskip("numpy")
    alloctrace.start(1, native=True)
    arrays = [np.ones(250_000) for _ in range(4)]
    product = np.ones((200, 200)) @ np.ones((200, 200))  # BLAS, without the GIL
    snapshot = alloctrace.take_snapshot()
    domain = np.lib.tracemalloc_domain
    numpy_stats = snapshot.filter_traces([alloctrace.DomainFilter(True, domain)])
    assert [t.size for t in numpy_stats.traces if t.size == 2_000_000] == [2_000_000] * 4
    native = snapshot.filter_traces([alloctrace.DomainFilter(True, "native")])
    assert not [t for t in native.traces if t.size == 2_000_000]
    assert consistent()
    del arrays, product


def test_cli_domain_option(stopped_tracer, ext, tmp_path):
    alloctrace.start(1, native=True)
    line = here() + 1
    ptr = ext.malloc(345_678)
    path = str(tmp_path / "cli.snap")
    alloctrace.take_snapshot().dump(path)
    ext.free(ptr)
    alloctrace.stop()
    result = run_python(["-m", "alloctrace", "stats", path, "--domain", "native", "--limit", "3"])
    assert result.returncode == 0, result.stderr
    assert f"test_native.py:{line}" in result.stdout
    bad = run_python(["-m", "alloctrace", "stats", path, "--domain", "natve"])
    assert bad.returncode == 2 and "the unknown name 'natve'" in bad.stderr


def test_run_native_option(tmp_path):
    path = build(tmp_path, "nativeext_run")
    script = tmp_path / "prog.py"
    script.write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('nativeext_run', {path!r})\n"
        "ext = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(ext)\n"
        "keep = ext.malloc(456_789)\n"
    )
    for option, expected in (["--native"], [456_789]), ([], []):
        out = str(tmp_path / f"run{len(option)}.snap")
        result = run_python(["-m", "alloctrace", "run", *option, "-q", "-o", out, str(script)])
        assert result.returncode == 0, result.stderr
        snapshot = alloctrace.Snapshot.load(out)
        native = snapshot.filter_traces([alloctrace.DomainFilter(True, "native")])
        assert [t.size for t in native.traces if t.size == 456_789] == expected
