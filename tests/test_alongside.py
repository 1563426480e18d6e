"""The standard tracemalloc and alloctrace tracing together, whichever started first: both
trace, each with the answers it gives alone (see src/hooks/alongside.rs)."""

import contextlib
import gc
import os
import subprocess
import sys
import textwrap
import threading
import tracemalloc

import pytest

import alloctrace


@pytest.fixture(autouse=True)
def both_stopped(stopped_tracer):
    tracemalloc.stop()
    yield
    tracemalloc.stop()
    alloctrace.stop()


def line_of(function, offset):
    return function.__code__.co_firstlineno + offset


def per_line(snapshot, filename=__file__):
    """{lineno: (size, count)} of this file's lines, from either module's snapshot."""
    return {
        stat.traceback[0].lineno: (stat.size, stat.count)
        for stat in snapshot.statistics("lineno")
        if stat.traceback[0].filename == filename
    }


def strings(n):
    return [str(i) * 3 for i in range(n)]


def floats(n):
    return [float(i) + 0.5 for i in range(n)]


def tuples(n):
    return [(i, i) for i in range(n)]


# Called once before any tracer starts: on 3.9 and 3.10 each comprehension keeps its frame
# object for the next call (the code object's "zombie" frame), allocated on the first call.
# Allocated while alloctrace traces and tracemalloc not yet, it would be on alloctrace's line
# alone, and stay there after the list is freed.
for warm_up in (strings, floats, tuples):
    warm_up(1)


def both_snapshots():
    """The two snapshots, taken with alloctrace's recording paused so that tracemalloc's
    snapshot (made first) is not in alloctrace's, and with the collector off: a full
    collection in between would empty the free lists, whose blocks stay allocated (charged to
    the line that made them) until then, and alloctrace's snapshot would miss them."""
    alloctrace.disable()
    gc.disable()
    try:
        return tracemalloc.take_snapshot(), alloctrace.take_snapshot()
    finally:
        gc.enable()
        alloctrace.enable()


def start_both(order, nframe=5, tracemalloc_nframe=5, sample_interval=None):
    """Starts the two tracers, alloctrace first or tracemalloc first."""
    starts = {
        "alloctrace": lambda: alloctrace.start(nframe, sample_interval=sample_interval),
        "tracemalloc": lambda: tracemalloc.start(tracemalloc_nframe),
    }
    first = order.removesuffix(" first")
    second = "tracemalloc" if first == "alloctrace" else "alloctrace"
    starts[first]()
    # Blocks that went to the free lists before the second started are in the first one's
    # table only: reused, they would count on its lines alone. A full collection empties the
    # free lists.
    gc.collect()
    starts[second]()
    assert alloctrace.is_tracing() and tracemalloc.is_tracing()


ORDERS = ["alloctrace first", "tracemalloc first"]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("sample_interval", [None, 1])
def test_same_per_line_figures_as_tracemalloc(order, sample_interval):
    start_both(order, sample_interval=sample_interval)
    # Freed floats and tuples go to free lists, and the lines below take them back: both
    # tracers must move those blocks to the line that reuses them.
    junk = [float(i) for i in range(5000)] + [(i, -i) for i in range(5000)]
    del junk
    kept = strings(20_000), floats(20_000), tuples(20_000)
    theirs, ours = both_snapshots()
    theirs, ours = per_line(theirs), per_line(ours)
    for function in (strings, floats, tuples):
        line = line_of(function, 1)
        assert theirs[line][1] > 20_000
        assert ours[line] == theirs[line], function.__name__
    del kept


@pytest.mark.parametrize("order", ORDERS)
def test_tracemalloc_tables_are_not_counted(order):
    start_both(order, tracemalloc_nframe=25)
    base_ours = alloctrace.get_traced_memory()[0]
    base_theirs = tracemalloc.get_traced_memory()[0]
    base_tables = tracemalloc.get_tracemalloc_memory()
    kept = strings(50_000)
    ours = alloctrace.get_traced_memory()[0] - base_ours
    theirs = tracemalloc.get_traced_memory()[0] - base_theirs
    tables = tracemalloc.get_tracemalloc_memory() - base_tables
    # Had tracemalloc's own tables been counted, ours would exceed theirs by their growth.
    assert tables > theirs // 4, (tables, theirs)
    assert abs(ours - theirs) < tables // 20, (ours, theirs, tables)
    del kept


@pytest.mark.parametrize("order", ORDERS)
def test_tracemalloc_stops_first_then_alloctrace_goes_on(order):
    for _ in range(3):
        start_both(order)
        kept = strings(1000)
        line = line_of(strings, 1)
        theirs, ours = both_snapshots()
        assert per_line(theirs)[line] == per_line(ours)[line]
        # tracemalloc puts back the allocators it found: ours, in either order.
        tracemalloc.stop()
        assert alloctrace.is_tracing() and not tracemalloc.is_tracing()
        del kept
        # Frees after tracemalloc stopped are seen: nothing of the list is left (once a full
        # collection emptied the free lists, where the list's own block may wait).
        gc.collect()
        assert line not in per_line(alloctrace.take_snapshot())
        kept = strings(1000)
        assert per_line(alloctrace.take_snapshot())[line][1] >= 1000
        del kept
        # Floats from the free list are still re-attributed (on 3.13, tracemalloc's stop
        # emptied the PyRefTracer slot, and ours had to go back in).
        gc.collect()
        junk = [float(i) for i in range(500)]
        del junk
        kept = floats(1000)
        assert per_line(alloctrace.take_snapshot())[line_of(floats, 1)][1] > 1000
        del kept
        alloctrace.stop()


def test_alloctrace_stops_first_then_tracemalloc_goes_on():
    alloctrace.start(5)
    tracemalloc.start(5)
    alloctrace.stop()
    kept = strings(3000)
    line = line_of(strings, 1)
    assert per_line(tracemalloc.take_snapshot())[line][1] > 3000
    del kept
    # Started again while tracemalloc traces (the layer beneath its hooks is still there).
    alloctrace.start(5)
    kept = strings(3000)
    theirs, ours = both_snapshots()
    assert per_line(theirs)[line] == per_line(ours)[line]
    tracemalloc.stop()
    del kept
    # And alongside again once tracemalloc stopped, in the first order.
    tracemalloc.start(5)
    kept = strings(3000)
    theirs, ours = both_snapshots()
    assert per_line(theirs)[line] == per_line(ours)[line]
    del kept


def test_started_while_tracemalloc_traces_every_order_of_stopping():
    line = line_of(strings, 1)
    for _ in range(3):
        gc.collect()
        tracemalloc.start(5)
        alloctrace.start(5)
        alloctrace.stop()  # tracemalloc goes on, our layer beneath it inert
        kept = strings(1000)
        assert per_line(tracemalloc.take_snapshot())[line][1] >= 1000
        alloctrace.start(5)  # beneath it again
        theirs, ours = both_snapshots()
        assert line not in per_line(ours)
        del kept
        alloctrace.stop()
        tracemalloc.stop()  # our inert layer is what it puts back: it only forwards
        kept = strings(1000)
        alloctrace.start(5)
        gc.collect()
        more = strings(1000)
        assert per_line(alloctrace.take_snapshot())[line][1] >= 1000
        alloctrace.stop()
        del kept, more


def test_started_while_tracemalloc_traces_refused_under_another_tools_hook():
    _testcapi = pytest.importorskip("_testcapi")
    tracemalloc.start(5)
    _testcapi.set_nomemory(2**30)  # another tool's hooks over tracemalloc's (see above)
    try:
        with pytest.raises(RuntimeError, match="not tracemalloc's alone"):
            alloctrace.start(5)
    finally:
        _testcapi.remove_mem_hooks()
    assert not alloctrace.is_tracing()
    kept = strings(1000)
    assert per_line(tracemalloc.take_snapshot())[line_of(strings, 1)][1] >= 1000
    del kept


def test_started_from_startup_while_tracemalloc_traces(tmp_path):
    # PYTHONTRACEMALLOC (or -X tracemalloc) and ALLOCTRACE together: tracemalloc traces from
    # the interpreter's start, alloctrace from site's, alongside it.
    script = tmp_path / "prog.py"
    script.write_text(
        textwrap.dedent(
            """
            import gc, tracemalloc, alloctrace
            gc.collect()  # free-listed blocks from before alloctrace started: theirs alone
            kept = [str(i) * 3 for i in range(5000)]
            gc.disable()
            alloctrace.disable()
            for module in (tracemalloc, alloctrace):
                stat = next(
                    s for s in module.take_snapshot().statistics("lineno")
                    if s.traceback[0].lineno == 4
                )
                print(module.__name__, stat.size, stat.count)
            """
        )
    )
    env = dict(os.environ, PYTHONTRACEMALLOC="5", ALLOCTRACE="5")
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    (_, size, count), (name, ours_size, ours_count) = (
        line.split() for line in proc.stdout.splitlines()
    )
    assert name == "alloctrace" and int(count) >= 5000
    assert (ours_size, ours_count) == (size, count), proc.stdout


def test_tracemalloc_start_refusing_its_argument_changes_nothing():
    alloctrace.start(5)
    with pytest.raises(ValueError):
        tracemalloc.start(0)
    assert not tracemalloc.is_tracing()
    kept = strings(1000)
    line = line_of(strings, 1)
    assert per_line(alloctrace.take_snapshot())[line][1] >= 1000
    del kept
    gc.collect()  # see test_tracemalloc_stops_first_then_alloctrace_goes_on
    assert line not in per_line(alloctrace.take_snapshot())


def test_refused_under_another_tools_hook():
    _testcapi = pytest.importorskip("_testcapi")
    alloctrace.start(5)
    # _testcapi's hooks wrap whatever is in place, as another tool's would; they fail nothing
    # before the 2**30th allocation.
    _testcapi.set_nomemory(2**30)
    try:
        with pytest.raises(RuntimeError, match="another allocator hook"):
            tracemalloc.start()
    finally:
        _testcapi.remove_mem_hooks()
    assert not tracemalloc.is_tracing()
    kept = strings(1000)
    assert per_line(alloctrace.take_snapshot())[line_of(strings, 1)][1] >= 1000
    del kept


def churn():
    """A worker thread's loop: bytearrays made and freed until `stopping` is set."""
    keep = []
    while not stopping.is_set():
        keep.append(bytearray(300))
        if len(keep) > 100:
            del keep[:80]
    keep.clear()


stopping = threading.Event()
CHURN_LINE = line_of(churn, 4)


@contextlib.contextmanager
def threads_churning(count=2):
    """Threads running `churn` for the duration of the block; their errors fail the test."""
    errors = []

    def worker():
        try:
            churn()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    stopping.clear()
    threads = [threading.Thread(target=worker) for _ in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stopping.set()
        for thread in threads:
            thread.join()
    assert not errors


def test_threads_allocating_while_tracemalloc_starts_and_stops():
    alloctrace.start(3)
    with threads_churning():
        for _ in range(40):
            tracemalloc.start(3)
            tracemalloc.take_snapshot()
            tracemalloc.stop()
    # Every bytearray the workers made was freed: none may be left behind as live.
    assert CHURN_LINE not in per_line(alloctrace.take_snapshot())


def test_threads_allocating_while_alloctrace_starts_and_stops_over_tracemalloc():
    tracemalloc.start(3)
    with threads_churning():
        for cycle in range(40):
            alloctrace.start(3)
            alloctrace.take_snapshot()
            if cycle % 4 == 3:
                # tracemalloc stops under alloctrace, and starts again above it.
                tracemalloc.stop()
                tracemalloc.start(3)
            alloctrace.stop()
        alloctrace.start(3)
    assert CHURN_LINE not in per_line(alloctrace.take_snapshot())
    assert CHURN_LINE not in per_line(tracemalloc.take_snapshot())


def test_fork_while_both_trace():
    alloctrace.start(3)
    gc.collect()
    tracemalloc.start(3)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        status = 1
        try:
            kept = strings(3000)
            theirs, ours = both_snapshots()
            line = line_of(strings, 1)
            status = 0 if per_line(theirs)[line] == per_line(ours)[line] else 3
            del kept
            tracemalloc.stop()
            alloctrace.stop()
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_tracemalloc_started_by_the_traced_program(tmp_path):
    # What a test suite checking its own tracemalloc support does under `alloctrace run`.
    script = tmp_path / "prog.py"
    script.write_text(
        textwrap.dedent(
            """
            import tracemalloc
            if not tracemalloc.is_tracing():
                tracemalloc.start(5)
            kept = [str(i) * 3 for i in range(5000)]
            stat = tracemalloc.take_snapshot().statistics("lineno")[0]
            print("tracemalloc", stat.traceback[0].lineno, stat.count)
            tracemalloc.stop()
            """
        )
    )
    out = tmp_path / "out.snap"
    alone, traced = (
        subprocess.run(
            [sys.executable, *command, str(script)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        for command in ([], ["-m", "alloctrace", "run", "-n", "5", "-o", str(out)])
    )
    assert alone.returncode == 0 and traced.returncode == 0, alone.stderr + traced.stderr
    assert alone.stdout.startswith("tracemalloc 5 500")
    assert traced.stdout == alone.stdout
    snapshot = alloctrace.Snapshot.load(str(out))
    assert per_line(snapshot, str(script))[5][1] >= 5000
