"""Each traceback's full depth (``total_nframe``) is tracemalloc's, however the stack got there.

On CPython 3.12 the depth comes from the interpreter's own frame counter instead of a walk to
the bottom of the stack, on the stack where a walk last agreed with it (src/capture/depth.rs).
These tests compare ``total_nframe`` and the frames with tracemalloc's for objects made on
stacks built in different ways (recursion, generators, coroutines, threads, finalizers, trace
functions, greenlets, which switch stacks without the counter, ``__init__`` above 3.13's
trampoline frame, frames in their prologue, a RecursionError raised entering a generator), and
check the counter against a walk on every use over a workload that goes through those paths. On
3.9 and 3.10 the depth below the captured frames comes from depths remembered per frame object,
forgotten when a frame is created at the same address (src/capture/frame_depths.rs): a scenario
calls the same functions over stacks of different depths, which CPython serves with the same
frame objects.
"""

import json
import sys
import textwrap

import pytest

from subproc import per_tracer, run_python

# The child: makes marker objects in each scenario, once under tracemalloc and once under
# alloctrace, and prints, per scenario, both tracers' (total_nframe, size, frames) of the traces
# made on the marking line.
CHILD = textwrap.dedent(
    """
    import asyncio, functools, json, sys, threading, tracemalloc
    import alloctrace
    from alloctrace import _native

    NFRAME, CHECK_EVERY = int(sys.argv[1]), int(sys.argv[2])
    if CHECK_EVERY:
        _native._depth_counter(CHECK_EVERY)
    try:
        import greenlet
    except ImportError:
        greenlet = None

    class Marker:
        __slots__ = ()

    # Preallocated, so that the marking line allocates nothing but the marker.
    made = [None] * 64
    count = 0

    def mark(make=Marker):
        global count
        made[count] = make()
        count += 1

    def down(n, then):
        if n == 0:
            return then()
        return down(n - 1, then)

    def churn():
        # Allocations between scenarios, so that the counter answers often.
        return [str(i) for i in range(300)]

    def gen():
        yield
        mark()
        yield

    def in_generator():
        g = gen()
        next(g)
        down(7, lambda: next(g))

    async def leaf():
        await asyncio.sleep(0)
        mark()

    async def middle(n):
        if n:
            return await middle(n - 1)
        return await leaf()

    class Dies:
        def __del__(self):
            mark()

    def dying():
        d = Dies()
        return 1

    def in_thread():
        t = threading.Thread(target=lambda: down(11, mark))
        t.start()
        t.join()

    def traced():
        def tracer(frame, event, arg):
            return None
        sys.settrace(tracer)
        try:
            down(5, mark)
        finally:
            sys.settrace(None)

    def in_greenlet(depth):
        def run():
            down(depth, mark)
            main.switch()
            down(2, mark)
        main = greenlet.getcurrent()
        g = greenlet.greenlet(run)
        down(30, g.switch)
        churn()
        mark()
        down(4, g.switch)
        mark()

    def helper():
        mark()

    class Init:
        def __init__(self, depth):
            down(depth, mark)

    def in_init():
        # From 3.13 a call of a class with a Python __init__, once specialized, runs
        # __init__ above a trampoline frame that tracemalloc does not count (it never gets
        # past its prologue) and CPython's frame counter does.
        for depth in (0, 2, 0, 2, 0, 2, 5, 5, 30, 30, 0):
            Init(depth)

    def with_cell():
        x = 1

        def inner():
            return x

        return inner

    def in_prologues():
        # The generator and the cell are made while their function's frame is still in its
        # prologue, which tracemalloc skips: the marking line is the frame that counts.
        # Called from C (functools.partial), the generator's frame sits on the interpreter's
        # entry shim, which links a frame before it counts it.
        for depth in (0, 3, 30, 3):
            down(depth, lambda: mark(gen))
            down(depth, lambda: mark(with_cell))
            down(depth, lambda: mark(functools.partial(gen)))

    def same_frames_other_depths():
        # On 3.9 and 3.10 a function's frame object is reused for its next call (the code
        # object keeps it), so the frame below the marking one is at the same address each
        # time, over stacks of other depths; a depth remembered for it must not be reused.
        for depth in (2, 12, 2, 30, 5, 5):
            down(depth, helper)

    SCENARIOS = {
        "shallow": mark,
        "same frames, other depths": same_frames_other_depths,
        "recursion 40": lambda: down(40, mark),
        "recursion 150": lambda: down(150, mark),
        "generator": in_generator,
        "coroutines": lambda: asyncio.run(middle(12)),
        "thread": in_thread,
        "finalizer": lambda: down(9, dying),
        "settrace": traced,
        "__init__": in_init,
    }
    # Before 3.11 there is no prologue to skip, and a generator's frame object comes from a
    # free list or its code's spare frame, whichever the other tracer's run left: a block one
    # run traces and the other does not.
    if sys.version_info >= (3, 11):
        SCENARIOS["prologues"] = in_prologues
    if greenlet is not None:
        SCENARIOS["greenlet 3"] = lambda: in_greenlet(3)
        SCENARIOS["greenlet 60"] = lambda: in_greenlet(60)

    MARK_LINE = mark.__code__.co_firstlineno + 2

    def run(module):
        global count
        result = {}
        for name, scenario in SCENARIOS.items():
            count = 0
            for _ in range(20):
                churn()
            module.start(NFRAME)
            scenario()
            traces = module.take_snapshot().traces
            module.stop()
            result[name] = sorted(
                [t.traceback.total_nframe, t.size, [(f.filename, f.lineno) for f in t.traceback]]
                for t in traces
                if t.traceback[-1].lineno == MARK_LINE and t.traceback[-1].filename == __file__
            )
            made[:] = [None] * 64
        return result

    # Both tracers run from the same line, so that the outermost frames compare equal.
    result = {module.__name__: run(module) for module in (tracemalloc, alloctrace)}
    print(json.dumps({
        **result,
        "counter": _native._depth_counter(),
        "greenlet": greenlet is not None,
    }))
    """
)


def compare(tmp_path, nframe, check_every):
    script = tmp_path / "depths.py"
    script.write_text(CHILD)
    proc = run_python([str(script), str(nframe), str(check_every)])
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["alloctrace"] == got["tracemalloc"]
    return got


@pytest.mark.parametrize("nframe", [1, 25])
def test_total_nframe_is_tracemallocs(tmp_path, nframe):
    got = compare(tmp_path, nframe, 0)
    # Every scenario made its markers (a scenario that made none would compare nothing).
    assert all(got["alloctrace"].values())
    assert got["greenlet"], "tests/requirements.txt installs greenlet"
    usable, checked, disagreed = got["counter"]
    if sys.version_info >= (3, 12):
        # The counter answered (it is checked once every 64 answers) and was never wrong.
        assert usable and checked > 0 and disagreed == 0
    else:
        assert not usable


@pytest.mark.skipif(sys.version_info < (3, 12), reason="the counter exists from CPython 3.12")
def test_the_counter_agrees_with_a_walk_on_every_use(tmp_path):
    got = compare(tmp_path, 1, 1)
    usable, checked, disagreed = got["counter"]
    assert (usable, disagreed) == (True, 0)
    assert checked > 1_000


# Tracing starts, or recording resumes, inside __init__ calls: on 3.13 trampolines are then on
# the stack that no allocation seen before announced (src/capture/depth.rs).
STARTED_INSIDE = textwrap.dedent(
    """
    import json, sys, tracemalloc
    import alloctrace

    NFRAME = int(sys.argv[1])
    made = []

    class Marker:
        __slots__ = ()

    def down(n, then):
        if n == 0:
            return then()
        return down(n - 1, then)

    def mark():
        made.append(Marker())

    class Starts:
        def __init__(self, module):
            module.start(NFRAME)
            for _ in range(200):
                down(3, mark)

    class Resumes:
        def __init__(self):
            alloctrace.enable()
            for _ in range(200):
                down(3, mark)
            alloctrace.disable()

    def depths(module):
        snapshot = module.take_snapshot()
        module.stop()
        line = mark.__code__.co_firstlineno + 1
        made.clear()
        return sorted(
            {t.traceback.total_nframe for t in snapshot.traces if t.traceback[-1].lineno == line}
        )

    result = {}
    for module in (tracemalloc, alloctrace):
        for _ in range(4):  # the last call is the specialized one
            down(2, lambda: Starts(module))
            result[module.__name__] = depths(module)
    alloctrace.start(NFRAME)
    alloctrace.disable()
    for _ in range(4):
        down(2, lambda: Resumes())
    result["resumed"] = depths(alloctrace)
    print(json.dumps(result))
    """
)


@pytest.mark.parametrize("nframe", [1, 25])
def test_total_nframe_when_tracing_starts_inside_init(tmp_path, nframe):
    script = tmp_path / "started.py"
    script.write_text(STARTED_INSIDE)
    proc = run_python([str(script), str(nframe)])
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    # One depth each: the marking line is always reached through the same frames.
    assert len(got["tracemalloc"]) == 1
    assert got["alloctrace"] == got["tracemalloc"] == got["resumed"]


# A generator resumed from C at the C recursion limit: the interpreter's entry links its frame,
# then refuses to run it and raises RecursionError before counting it (3.12+). tracemalloc counts
# that frame in the error's allocations (a generator's frame is never incomplete to it); the
# counter does not. "fresh" and "resumed" reach the limit at a generator's first resume; "again"
# primes a generator near the top and resumes it a second time at the limit, found by a binary
# search over the depth of the descent (the shallowest that fails fails entering that
# generator, since one level less entered it). Each tracer runs in a process of its own, so that
# neither inherits the other's leftovers (free lists, the exception's frames).
AT_THE_LIMIT = textwrap.dedent(
    """
    import collections, dis, gc, json, sys, tracemalloc
    import alloctrace

    if sys.version_info >= (3, 12):
        # Python frames no longer count towards the C limit: put the Python limit past it, so
        # that the limit reached is the C one, at the entry into a generator.
        sys.setrecursionlimit(1_000_000)

    def fresh(n):
        yield next(fresh(n + 1))

    def resumed(n):
        yield
        g = resumed(n + 1)
        next(g)
        yield next(g)

    def second(g):
        next(g)
        return next(g)

    def primed():
        yield
        yield

    def wrap(k, g):
        yield down(k, g)

    def down(k, g):
        return next(g) if k == 0 else next(wrap(k - 1, g))

    def attempt(k, catch):
        g = primed()
        next(g)
        if not catch:
            return down(k, g)
        try:
            down(k, g)
        except RecursionError:
            return True
        return False

    def shallowest_failing():
        ok, fails = 0, 1
        while not attempt(fails, True):
            ok, fails = fails, fails * 2
        while fails - ok > 1:
            middle = (ok + fails) // 2
            if attempt(middle, True):
                fails = middle
            else:
                ok = middle
        return fails

    SCENARIOS = {
        "fresh": (fresh, lambda: next(fresh(0))),
        "resumed": (resumed, lambda: second(resumed(0))),
        "again": (primed, lambda: attempt(depth, False)),
    }

    def run(module):
        global depth
        # Searched untraced (tracemalloc 3.13 walks the whole stack for each allocation, so a
        # traced search takes a minute), from the depth the scenario's lambda calls attempt at.
        depth = shallowest_failing()
        result = {}
        for name, (function, scenario) in SCENARIOS.items():
            code = function.__code__
            lines = {code.co_firstlineno} | {line for _, line in dis.findlinestarts(code)}
            gc.collect()
            module.start(1)
            try:
                scenario()
            except RecursionError as e:
                error = e
            snapshot = module.take_snapshot()
            module.stop()
            del error
            # The generators' own lines: the run's frames below are not what is compared.
            counts = collections.Counter(
                (t.traceback[0].lineno, t.traceback.total_nframe, t.size)
                for t in snapshot.traces
                if t.traceback[0].filename == __file__ and t.traceback[0].lineno in lines
            )
            result[name] = sorted([*key, n] for key, n in counts.items())
        return result

    print(json.dumps(run({"tracemalloc": tracemalloc, "alloctrace": alloctrace}[sys.argv[1]])))
    """
)


def test_total_nframe_of_a_recursion_error_raised_entering_a_generator(tmp_path):
    script = tmp_path / "limit.py"
    script.write_text(AT_THE_LIMIT)
    got = per_tracer([str(script)])
    # The first two reached the limit deep down (hundreds of generators each).
    assert len(got["tracemalloc"]["fresh"]) > 100
    assert len(got["tracemalloc"]["resumed"]) > 100
    if sys.version_info >= (3, 12):
        # The error was raised entering the primed generator (before 3.12, the Python limit
        # stops the call before its frame is linked, and no trace is on its lines).
        assert got["tracemalloc"]["again"]
    assert got["alloctrace"] == got["tracemalloc"]
