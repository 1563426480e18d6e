"""Reliability under threads, fork, shutdown and memory pressure.

Every risky scenario runs in a child interpreter with a timeout, so that a crash or a
deadlock fails its test instead of killing or hanging pytest. Each is bounded in time and
iterations (a few seconds on a 2-core machine). The child prints ``ok`` as its last line
when all of its checks passed; anything else (an assertion, a signal, a hang) is a failure
whose output is shown.
"""

import os
import subprocess
import sys
import textwrap

import pytest

import alloctrace

# The C library and Python's RAW allocator via ctypes, for allocating on C threads (no
# alloctrace import: a test may need threads before it).
C_THREADS = textwrap.dedent(
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    raw_malloc = ctypes.cast(ctypes.pythonapi.PyMem_RawMalloc, ctypes.c_void_p).value
    raw_free = ctypes.cast(ctypes.pythonapi.PyMem_RawFree, ctypes.c_void_p).value
    libc.pthread_create.argtypes = [
        ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p
    ]
    libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.POINTER(ctypes.c_void_p)]

    def c_threads(routine, args):
        \"\"\"Run routine(arg) on one new C thread per arg (pthread_create straight into a C
        function: no Python thread state exists on them); return their results.\"\"\"
        handles = []
        for arg in args:
            handle = ctypes.c_ulong()
            err = libc.pthread_create(ctypes.byref(handle), None, routine, arg)
            assert err == 0, f"pthread_create: {err}"
            handles.append(handle)
        results = []
        for handle in handles:
            result = ctypes.c_void_p()
            assert libc.pthread_join(handle.value, ctypes.byref(result)) == 0
            results.append(result.value)
        return results
    """
)

# Shared by the child scripts: exact totals (current traced memory and the sum of the live
# traces' sizes), and C threads.
PRELUDE = C_THREADS + textwrap.dedent(
    """
    import ctypes, gc, os, sys, threading, time
    import alloctrace

    def totals():
        # Recording paused, so the objects built to answer are not counted. A traced block
        # may still be freed between the two reads (the garbage collector, or a CPython cache
        # letting go of an old entry: the type attribute cache keeps the last name looked
        # up), so read current on both sides of the traces and retry until they agree.
        alloctrace.disable()
        try:
            for _ in range(100):
                before = alloctrace.get_traced_memory()[0]
                traces = alloctrace._get_traces()
                if alloctrace.get_traced_memory()[0] == before:
                    break
        finally:
            alloctrace.enable()
        sizes = {}
        for t in traces:
            sizes[t[1]] = sizes.get(t[1], 0) + 1
        return before, sum(t[1] for t in traces), sizes

    def check_consistent(where):
        current, total, _ = totals()
        assert current == total, f"{where}: current {current} != sum of traces {total}"
    """
)


def run_child(body, *, timeout=60, env=None, args=(), prelude=PRELUDE):
    """Run prelude + body in a fresh interpreter; return its stdout lines. Fails the test on a
    non-zero exit, a signal, a timeout, or a last line other than ``ok``."""
    code = prelude + textwrap.dedent(body)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ALLOCTRACE")}
    full_env.update(env or {})
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"child hung (no exit within {timeout}s); output so far: {exc.stdout!r}")
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0, (
        f"child exited with {out.returncode}\nstdout: {out.stdout}\nstderr: {out.stderr}"
    )
    assert lines and lines[-1] == "ok", f"stdout: {out.stdout}\nstderr: {out.stderr}"
    return lines


def test_eight_threads_churn_while_another_restarts_clears_and_snapshots():
    run_child(
        """
        stop = threading.Event()
        errors = []
        # Sizes no other code here allocates: after everything is freed, a trace of one of
        # these sizes would be a trace left behind for a freed block.
        MARKERS = [40_001 + 16 * k for k in range(8)]

        def churn(k):
            try:
                keep = []
                i = 0
                while not stop.is_set():
                    keep.append(bytearray(MARKERS[k] - 1))  # bytearray(n) asks n + 1 bytes
                    grow = bytearray(100 + i % 300)
                    grow.extend(b"y" * (i % 5000))  # realloc, growing and moving
                    keep.append({i: str(i)})
                    if len(keep) > 60:
                        del keep[:45]
                    i += 1
                keep.clear()
            except BaseException as exc:
                errors.append(exc)

        def control():
            # Every operation at least 8 times, for about two seconds.
            try:
                deadline = time.monotonic() + 2.0
                i = 0
                while i < 48 or time.monotonic() < deadline:
                    step = i % 6
                    i += 1
                    if step == 0:
                        alloctrace.take_snapshot() if alloctrace.is_tracing() else None
                    elif step == 1:
                        alloctrace.clear_traces()
                    elif step == 2:
                        alloctrace.reset_peak()
                    elif step == 3:
                        alloctrace.stop()
                    elif step == 4:
                        alloctrace.start(1 + i % 7)
                    else:
                        alloctrace.get_traced_memory()
                        alloctrace._get_traces()
            except BaseException as exc:
                errors.append(exc)

        sys.setswitchinterval(0.0005)  # more interleavings per second
        alloctrace.start(5)
        workers = [threading.Thread(target=churn, args=(k,)) for k in range(8)]
        controller = threading.Thread(target=control)
        for t in workers:
            t.start()
        controller.start()
        try:
            controller.join(timeout=30)
            assert not controller.is_alive(), "control thread stuck"
            # The control thread may have left tracing off: on again for the rest of the churn.
            alloctrace.start(5)
            time.sleep(0.3)
        finally:
            stop.set()
        for t in workers:
            t.join(timeout=30)
            assert not t.is_alive(), "worker stuck"
        assert not errors, errors
        check_consistent("after churn")
        gc.collect()
        _, _, sizes = totals()
        stale = {size: n for size, n in sizes.items() if size in MARKERS}
        assert not stale, f"traces left for freed blocks: {stale}"
        check_consistent("after collect")
        print("ok")
        """
    )


def test_c_threads_without_thread_state_allocate_in_raw_domain():
    run_child(
        """
        stop = threading.Event()
        errors = []

        def python_side():
            # Python threads allocating and snapshotting at the same time.
            try:
                while not stop.is_set():
                    data = [bytes(64 + i) for i in range(100)]
                    alloctrace.take_snapshot()
                    del data
            except BaseException as exc:
                errors.append(exc)

        alloctrace.start(3)
        py_threads = [threading.Thread(target=python_side) for _ in range(2)]
        for t in py_threads:
            t.start()
        SIZE = 77_777
        try:
            for round in range(20):
                # 16 C threads each PyMem_RawMalloc(SIZE + round); the thread's return value
                # is the block. The ctypes calls release the GIL, so these run concurrently
                # with the Python threads.
                size = SIZE + round
                blocks = c_threads(raw_malloc, [size] * 16)
                assert all(blocks), "PyMem_RawMalloc failed"
                alloctrace.disable()
                traces = [t for t in alloctrace._get_traces() if t[1] == size]
                alloctrace.enable()
                assert len(traces) == 16, (round, len(traces))
                # No Python thread state on those threads: the unknown traceback.
                assert all(t[2] == (("<unknown>", 0),) for t in traces), traces[:2]
                c_threads(raw_free, blocks)
                alloctrace.disable()
                left = [t for t in alloctrace._get_traces() if t[1] == size]
                alloctrace.enable()
                assert not left, f"freed blocks still traced: {len(left)}"
        finally:
            stop.set()
            for t in py_threads:
                t.join()
        assert not errors, errors
        check_consistent("after C threads")
        print("ok")
        """
    )


@pytest.mark.parametrize("static_tls", ["default", "no reserve"])
def test_threads_running_before_the_import_get_hook_state_of_their_own(static_tls):
    # The hooks' per-thread state is a thread-local reached through a TLS descriptor (see
    # src/hooks/hook_thread.rs): the loader places it in its static TLS reserve when that has room,
    # as it usually has, and otherwise takes a slower path, which the glibc tunable forces
    # here. Either way threads already running when the module is loaded, Python threads and
    # C threads alike, must each find a zeroed state of their own: a shared one would leave
    # one thread's blocks untraced while another is inside the tracer.
    env = {}
    if static_tls == "no reserve":
        env["GLIBC_TUNABLES"] = "glibc.rtld.optional_static_tls=0"
    run_child(
        """
        import sys, threading

        ROUNDS, PER_ROUND = 30, 40
        go, done = threading.Event(), []

        def allocate(index):
            go.wait()
            keep = [[bytearray(4_000 + index) for _ in range(PER_ROUND)] for _ in range(ROUNDS)]
            done.append((index, keep))

        threads = [threading.Thread(target=allocate, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        sys.setswitchinterval(1e-6)
        import alloctrace  # noqa: E402 (after the threads, on purpose)

        alloctrace.start()
        go.set()
        for t in threads:
            t.join()
        # C threads with no Python thread state, in the RAW domain.
        blocks = c_threads(raw_malloc, [55_555] * 8)
        snapshot = alloctrace.take_snapshot()
        counts = {}
        for trace in snapshot.traces:
            counts[trace.size] = counts.get(trace.size, 0) + 1
        # A bytearray's buffer holds a trailing NUL.
        for index in range(4):
            assert counts.get(4_001 + index) == ROUNDS * PER_ROUND, (index, counts)
        assert all(blocks) and counts.get(55_555) == 8, counts.get(55_555)
        alloctrace.disable()
        current = alloctrace.get_traced_memory()[0]
        total = sum(t[1] for t in alloctrace._get_traces())
        assert current == total, (current, total)
        print("ok")
        """,
        env=env,
        prelude=C_THREADS,
    )


def test_c_threads_allocate_across_stop_and_start():
    """RAW hooks on C threads racing with stop()/start(): no crash, exact totals after."""
    run_child(
        """
        done = threading.Event()

        def churn_from_c():
            while not done.is_set():
                blocks = c_threads(raw_malloc, [4096] * 8)
                c_threads(raw_free, blocks)

        alloctrace.start()
        t = threading.Thread(target=churn_from_c)
        t.start()
        for i in range(200):
            alloctrace.stop()
            alloctrace.start(1 + i % 3)
            if i % 10 == 0:
                alloctrace.clear_traces()
        done.set()
        t.join(timeout=30)
        assert not t.is_alive()
        check_consistent("after restarts")
        print("ok")
        """
    )


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_while_threads_are_inside_the_hooks():
    run_child(
        """
        import warnings
        warnings.simplefilter("ignore", DeprecationWarning)  # fork of a threaded process
        stop = threading.Event()

        def python_churn():
            while not stop.is_set():
                [bytearray(100 + i) for i in range(50)]

        def raw_churn():
            # Without the GIL: these are in the hooks at any moment, fork or not.
            while not stop.is_set():
                c_threads(raw_free, c_threads(raw_malloc, [1000] * 4))

        alloctrace.start(4)
        threads = [threading.Thread(target=python_churn) for _ in range(2)]
        threads += [threading.Thread(target=raw_churn) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            for n in range(25):
                pid = os.fork()
                if pid == 0:
                    status = 1
                    try:
                        # The child has one thread; its tracer must work and be its own.
                        obj = bytearray(54_321)
                        assert alloctrace.is_tracing()
                        tb = alloctrace.get_object_traceback(obj)
                        assert tb is not None and tb[-1].lineno > 0
                        blocks = c_threads(raw_malloc, [4321] * 2)
                        c_threads(raw_free, blocks)
                        alloctrace.take_snapshot()
                        alloctrace.stop()
                        alloctrace.start(2)
                        assert alloctrace.get_object_traceback(bytearray(999)) is not None
                        check_consistent("child")
                        status = 0
                    finally:
                        os._exit(status)
                deadline = time.monotonic() + 20
                while True:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        break
                    if time.monotonic() > deadline:
                        os.kill(pid, 9)
                        raise AssertionError(f"fork child {n} deadlocked")
                    time.sleep(0.005)
                assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (n, status)
        finally:
            stop.set()
            for t in threads:
                t.join()
        check_consistent("parent")
        print("ok")
        """
    )


MULTIPROCESSING = """
import multiprocessing as mp

def child_report(nframe):
    # With the fork method the child inherits tracing; with spawn it starts it here, or it was
    # started by ALLOCTRACE at interpreter start-up.
    traced_from_start = alloctrace.is_tracing()
    if not traced_from_start:
        alloctrace.start(nframe)
    data = [bytes(333) for _ in range(1000)]
    tb = alloctrace.get_object_traceback(data[0])
    snapshot = alloctrace.take_snapshot()
    current, total, _ = totals()
    return (
        os.getpid(),
        traced_from_start,
        tb is not None and tb[-1].lineno > 0,
        len(snapshot.traces) >= 1000,
        current == total,
    )

if __name__ == "__main__":
    method, how = sys.argv[1], sys.argv[2]
    if how == "env":
        os.environ["ALLOCTRACE"] = "3"  # inherited by the spawned interpreters
    alloctrace.start(3)
    keep = [bytearray(1000) for _ in range(100)]
    ctx = mp.get_context(method)
    with ctx.Pool(2, maxtasksperchild=1) as pool:  # a fresh process per task
        results = pool.map(child_report, [3] * 6)
    for pid, from_start, has_tb, has_traces, exact in results:
        assert pid != os.getpid()
        assert from_start == (method == "fork" or how == "env"), (method, how, results)
        assert has_tb and has_traces and exact, (method, results)
    check_consistent("parent")
    assert alloctrace.get_object_traceback(keep[0]) is not None
    print("ok")
"""


def _has_startup_tracing():
    import importlib.util

    return importlib.util.find_spec("alloctrace._startup") is not None


@pytest.mark.parametrize(
    "method, how",
    [
        ("fork", "code"),
        ("spawn", "code"),
        pytest.param(
            "spawn",
            "env",
            marks=pytest.mark.skipif(
                not _has_startup_tracing(), reason="this build has no ALLOCTRACE start-up"
            ),
        ),
    ],
)
def test_multiprocessing_children_trace_themselves(method, how, tmp_path):
    # spawn re-imports the main module, so this one needs a file, not -c.
    script = tmp_path / "mp_child.py"
    script.write_text(PRELUDE + textwrap.dedent(MULTIPROCESSING))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALLOCTRACE")}
    try:
        out = subprocess.run(
            [sys.executable, str(script), method, how],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=tmp_path,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"multiprocessing ({method}) hung")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "ok", out.stdout


def test_interpreter_shutdown_with_daemon_threads_still_allocating():
    lines = run_child(
        """
        def forever_python():
            while True:
                [bytearray(200) for _ in range(20)]

        def forever_raw():
            while True:
                c_threads(raw_free, c_threads(raw_malloc, [512] * 4))

        alloctrace.start(5)
        for target in (forever_python, forever_python, forever_raw):
            threading.Thread(target=target, daemon=True).start()
        time.sleep(0.3)
        print("ok", flush=True)
        # Exit with tracing on and the daemon threads inside the hooks.
        """
    )
    assert lines == ["ok"]


def test_stop_from_atexit_handler_while_threads_allocate():
    lines = run_child(
        """
        import atexit

        def forever():
            while True:
                [bytearray(300) for _ in range(20)]

        @atexit.register
        def last():
            alloctrace.take_snapshot()
            alloctrace.stop()
            assert not alloctrace.is_tracing()
            print("ok", flush=True)

        alloctrace.start(2)
        threading.Thread(target=forever, daemon=True).start()
        time.sleep(0.2)
        print("main done", flush=True)
        """
    )
    assert lines == ["main done", "ok"]


def _subinterpreters():
    for name in ("_interpreters", "_xxsubinterpreters"):
        try:
            return __import__(name)
        except ImportError:
            continue
    return None


@pytest.mark.skipif(_subinterpreters() is None, reason="no sub-interpreter module here")
def test_sub_interpreters_allocate_safely_and_cannot_start_tracing():
    run_child(
        """
        try:
            import _interpreters as interpreters
        except ImportError:
            import _xxsubinterpreters as interpreters

        def run(interp, source):
            # 3.13's _interpreters.run_string returns an error summary instead of raising.
            err = interpreters.run_string(interp, source)
            if err is not None:
                raise RuntimeError(f"sub-interpreter failed: {err}")

        alloctrace.start(4)
        interp = interpreters.create()
        # The main interpreter's traces stay exact while another interpreter allocates; its
        # own allocations are recorded with the unknown traceback.
        run(interp, "data = [bytearray(65_432) for _ in range(50)]")
        alloctrace.disable()
        theirs = [t for t in alloctrace._get_traces() if t[1] == 65_433]
        alloctrace.enable()
        assert len(theirs) >= 50, len(theirs)
        assert all(t[2] == (("<unknown>", 0),) for t in theirs), theirs[:2]
        check_consistent("while the sub-interpreter holds memory")
        # The tracer belongs to the main interpreter: from a sub-interpreter, every call that
        # touches its state is refused with a clear RuntimeError (or the import itself is
        # refused, where the interpreter has its own GIL), never a crash.
        run(interp, '''if True:
            try:
                import alloctrace
            except ImportError as exc:
                assert "interpreter" in str(exc), exc
            else:
                calls = [
                    lambda: alloctrace.start(),
                    lambda: alloctrace.stop(),
                    lambda: alloctrace.clear_traces(),
                    lambda: alloctrace.take_snapshot(),
                    lambda: alloctrace._get_traces(),
                    lambda: alloctrace.get_object_traceback([]),
                    lambda: alloctrace.set_traceback_limit(3),
                ]
                for call in calls:
                    try:
                        call()
                    except RuntimeError as exc:
                        assert "main interpreter" in str(exc), exc
                    else:
                        raise AssertionError("a sub-interpreter changed the main tracer")
                assert alloctrace.is_tracing()
        ''')
        assert alloctrace.is_tracing() and alloctrace.get_traceback_limit() == 4
        run(interp, "del data")
        interpreters.destroy(interp)
        check_consistent("after destroy")
        alloctrace.disable()
        left = [t for t in alloctrace._get_traces() if t[1] == 65_433]
        alloctrace.enable()
        assert not left, "the sub-interpreter's freed blocks are still traced"
        print("ok")
        """
    )


@pytest.mark.skipif(
    sys.version_info < (3, 12) or _subinterpreters() is None,
    reason="sub-interpreters with a GIL of their own came in 3.12",
)
def test_own_gil_sub_interpreter_allocating_beside_the_main_one_keeps_totals_exact():
    # The main interpreter's GIL holder updates the totals without locked instructions; a
    # sub-interpreter with its own GIL runs at the same time and must use the atomic side.
    run_child(
        """
        import threading
        try:
            import _interpreters as interpreters
        except ImportError:
            import _xxsubinterpreters as interpreters

        alloctrace.start(1)
        interp = interpreters.create()
        errors = []

        def theirs():
            err = interpreters.run_string(interp, '''if True:
                kept = []
                for i in range(3000):
                    batch = [bytearray(100 + i % 50) for _ in range(40)]
                    kept.append(batch[0])
                    del batch
                    if len(kept) > 500:
                        del kept[:250]
            ''')
            if err is not None:
                errors.append(err)

        thread = threading.Thread(target=theirs)
        thread.start()
        ours = []
        rounds = 0
        while thread.is_alive():
            batch = [bytes(range(i % 200)) for i in range(200)]
            ours.append(batch[-1])
            if len(ours) > 300:
                del ours[:150]
            rounds += 1
        thread.join()
        assert not errors, errors
        check_consistent(f"after both interpreters allocated at once ({rounds} rounds here)")
        interpreters.destroy(interp)
        check_consistent("after destroy")
        print("ok")
        """
    )


MEMORY_PRESSURE = """
import resource
limit = int(sys.argv[1]) << 20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
alloctrace.start(int(sys.argv[2]))
small, big = [], []
# Fill the address space with 1 MiB blocks, then give it back one at a time and fill each gap
# with small objects: Python's own allocations find room, while the tracer's tables, which
# grow by doubling, cannot. Every MemoryError here is the program's own, raised normally.
try:
    while True:
        big.append(bytearray(1 << 20))
except MemoryError:
    pass
freed = 0
while big and alloctrace._native.get_dropped_traces() == 0:
    del big[-1]
    freed += 1
    try:
        while True:
            small.append([str(i) for i in range(1000)])
    except MemoryError:
        pass
dropped = alloctrace._native.get_dropped_traces()
del small, big
gc.collect()
assert dropped > 0, "the tracer never ran out of memory: the test did not test anything"
# Dropped blocks are untraced: the totals stay those of the traced blocks.
check_consistent("after memory pressure")
# Once memory is back, tracing carries on normally.
obj = bytearray(12_345)
assert alloctrace.get_object_traceback(obj) is not None
alloctrace.clear_traces()
assert alloctrace._native.get_dropped_traces() == 0
print("dropped", dropped)
print("ok")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS behaviour is Linux's")
@pytest.mark.parametrize("nframe", [1, 25])
def test_out_of_memory_drops_traces_instead_of_crashing(nframe):
    lines = run_child(MEMORY_PRESSURE, args=("200", str(nframe)), timeout=120)
    assert int(lines[-2].split()[1]) > 0


def test_dropped_traces_is_zero_normally():
    alloctrace.start()
    try:
        data = [bytes(100) for _ in range(1000)]
        assert alloctrace._native.get_dropped_traces() == 0
        del data
    finally:
        alloctrace.stop()
