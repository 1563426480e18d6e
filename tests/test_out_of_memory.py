"""Running out of memory raises MemoryError, as tracemalloc does, and the program goes on.

Each test runs one operation in a child process holding a traced heap of 60,000 blocks with
distinct 25-frame tracebacks, under a range of address-space limits (``RLIMIT_AS``, from 1
MiB above what the process already uses to 192 MiB above it): every attempt must either
succeed or raise ``MemoryError``, never abort the process, and the same call must work once
the limit is lifted. Before alloctrace reserved memory fallibly, most of these operations
ended in ``memory allocation of N bytes failed`` and exit status 134 at some of the limits.
"""

import json
import subprocess
import sys
import textwrap

import pytest

from subproc import clean_env

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is Linux's")

# MiB of address space allowed above the process's size when the operation starts: small
# ones fail at the first large table, larger ones part-way through, the largest succeed.
HEADROOMS = (1, 4, 16, 32, 48, 64, 96, 128, 192)

# A traced heap of 60,000 blocks with distinct 25-frame tracebacks.
TRACED_HEAP = """
import alloctrace

alloctrace.start(25)
source = "def leaf(keep):\\n" + "".join(
    f"    keep.append(bytes({i % 40}))\\n" for i in range(3000)
)
namespace = {}
exec(compile(source, "generated_module.py", "exec"), namespace)

def down(depth, keep):
    return namespace["leaf"](keep) if depth == 0 else down(depth - 1, keep)

keep = []
for depth in range(20):
    down(depth, keep)
"""

UNDER_LIMIT = """
import gc, resource, sys

def vm_size():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()

def under_limit(operation):
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    outcomes = []
    for kib in HEADROOMS_KIB:
        gc.collect()
        resource.setrlimit(resource.RLIMIT_AS, (vm_size() + (kib << 10), hard))
        try:
            operation()
            outcomes.append("ok")
        except MemoryError:
            outcomes.append("MemoryError")
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    operation()
    print(" ".join(outcomes))
    print("the program went on")
"""

# Operations on the live tracer run in the process that made the heap; the others on the
# snapshot of such a heap, loaded from a file written by another process. Either way the
# process has done nothing of the operation's size before, so its memory allocator holds no
# freed blocks that would let the operation run without asking for new address space.
LIVE = {
    "take_snapshot": "alloctrace.take_snapshot()",
    "take_snapshot_objects": "alloctrace.take_snapshot(objects=True)",
    "get_traces": "alloctrace._get_traces()",
    "retention": "alloctrace.retention(keep)",
    "take_snapshot_retention": "alloctrace.take_snapshot(retention=3)",
}
ON_A_FILE = {
    "load": "alloctrace.Snapshot.load(path)",
    "statistics": "snapshot.statistics('traceback')",
    "compare_to": "snapshot.compare_to(snapshot, 'traceback')",
    "filter_traces": "snapshot.filter_traces([alloctrace.Filter(False, 'nothing.py')])",
    "traces": "list(snapshot.traces)",
    "dump": "snapshot.dump(path + '.out')",
    "to_pprof": "snapshot.to_pprof(path + '.out')",
    "to_collapsed": "snapshot.to_collapsed(path + '.out')",
    "to_flamegraph": "snapshot.to_flamegraph(path + '.out')",
}


ON_A_FILE_SETUP = "import alloctrace\nsnapshot = alloctrace.Snapshot.load(path)\n"


def limited(headrooms_kib, setup, operation):
    """The child's script: `setup`, then `operation` under each limit in turn, then once more
    without one."""
    return (
        f"HEADROOMS_KIB = {tuple(headrooms_kib)!r}\n"
        + textwrap.dedent(UNDER_LIMIT)
        + "path = sys.argv[1]\n"
        + textwrap.dedent(setup)
        + f"under_limit(lambda: {operation})\n"
    )


def run_child(script, *args):
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        # A fixed mmap threshold: large blocks are mapped and unmapped each time, so each
        # attempt needs new address space (glibc's adaptive threshold would serve them from
        # heap memory freed by the attempt before, and no limit would bite).
        env=clean_env(MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072"),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def snapshot_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("oom") / "big.snap"
    made = run_child(
        textwrap.dedent(TRACED_HEAP) + "alloctrace.take_snapshot().dump(__import__('sys').argv[1])",
        str(path),
    )
    assert made.returncode == 0, made.stderr
    return path


@pytest.mark.parametrize("name", sorted({**LIVE, **ON_A_FILE}))
def test_out_of_memory_raises_memory_error(snapshot_file, name):
    if name in LIVE:
        setup, operation = TRACED_HEAP, LIVE[name]
    else:
        setup, operation = ON_A_FILE_SETUP, ON_A_FILE[name]
    script = limited([mib << 10 for mib in HEADROOMS], setup, operation)
    child = run_child(script, str(snapshot_file))
    assert child.returncode == 0, f"{name}: exit status {child.returncode}\n{child.stderr[-2000:]}"
    assert "memory allocation of" not in child.stderr
    outcomes, went_on = child.stdout.split("\n")[:2]
    outcomes = outcomes.split()
    assert went_on == "the program went on"
    assert len(outcomes) == len(HEADROOMS)
    # Each outcome is one of the two allowed, and the smallest limit is too small (so the
    # test is about running out).
    assert set(outcomes) <= {"ok", "MemoryError"}
    assert outcomes[0] == "MemoryError", outcomes


# Limits between those of HEADROOMS, each in a fresh process after two attempts that fail,
# as the test above meets them: `dump` once grew its buffers without checking, and at some of
# these limits a large growth, or a small one after the allocator's reserve was spent,
# aborted the process (CPython 3.9: 10 of 40 limits between 17 and 22 MiB).
def test_dump_never_aborts_at_limits_between_the_headrooms(snapshot_file):
    for kib in range(16 * 1024, 24 * 1024, 512):
        script = limited([1024, 4096, kib], ON_A_FILE_SETUP, ON_A_FILE["dump"])
        child = run_child(script, str(snapshot_file))
        assert child.returncode == 0, f"{kib} KiB: exit {child.returncode}\n{child.stderr[-2000:]}"
        assert "memory allocation of" not in child.stderr
        outcomes, went_on = child.stdout.split("\n")[:2]
        assert set(outcomes.split()) <= {"ok", "MemoryError"}, outcomes
        assert went_on == "the program went on"


# Issue 61 item 7: error paths of the native module under _testcapi.set_nomemory, failing the
# Nth Python allocation of the call, for each N in turn, until 40 attempts in a row fail no
# allocation (every allocation point of the call was met). Each attempt must succeed or raise
# MemoryError or the error the call raises with memory to spare; never panic
# (pyo3_runtime.PanicException, "PyObject pointer is null") or abort.
#
# One SystemError is the interpreter's, not ours: on 3.11-3.13, an exception leaving a frame
# whose frame object needs the caller's (f_back) is lost if that allocation fails (frame.c's
# take_ownership clears every exception, CPython issue 131173), and the caller
# raises SystemError("error return without exception set"). A pure-Python
# function that raises shows it at the same point (the `control` operation below); it is allowed
# only where the control shows it, and only with that message: a native function returning an
# error without an exception set says "returned NULL without setting an exception" instead.
NO_MEMORY_SWEEP = """
import json, sys, _testcapi

def sweep(operation, expected, traced=None):
    outcomes, quiet, start = {}, 0, 0
    while quiet < 40 and start < 5000:
        # Tracing (alloctrace's or tracemalloc's) starts and stops outside the failing window.
        if traced:
            traced.start(5)
        try:
            _testcapi.set_nomemory(start, start + 1)
            try:
                operation()
            finally:
                _testcapi.remove_mem_hooks()
            outcome = "ok"
        except MemoryError:
            outcome = "MemoryError"
        except SystemError as exc:
            outcome = f"SystemError: {exc}"
        except expected as exc:
            outcome = f"expected: {type(exc).__name__}"
        finally:
            if traced:
                traced.stop()
        quiet = 0 if outcome == "MemoryError" or outcome.startswith("SystemError") else quiet + 1
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        start += 1
    return start, outcomes

results = {}
for name in sys.argv[1:]:
    operation, expected, traced = OPERATIONS[name]
    results[name] = sweep(operation, expected, traced)
print(json.dumps(results))
"""

NO_MEMORY_OPERATIONS = """
import os, tempfile, tracemalloc
import alloctrace

def raising():
    raise ValueError("a pure-Python function raising: the interpreter's own behaviour")

def start_alongside():
    # start() with tracemalloc tracing: refused (RuntimeError) while _testcapi's hooks sit
    # over tracemalloc's, after looking at tracemalloc (see src/hooks/alongside.rs).
    try:
        alloctrace.start()
    finally:
        alloctrace.stop()

directory = tempfile.mkdtemp()
good, bad = os.path.join(directory, "good.snap"), os.path.join(directory, "bad.snap")
alloctrace.start(5)
keep = [bytearray(64 + i) for i in range(200)]
snapshot = alloctrace.take_snapshot()
alloctrace.stop()
snapshot.dump(good)
with open(bad, "wb") as stream:
    stream.write(b"ALCTRSNP" + bytes(range(256)) * 2)
other = alloctrace.Snapshot.load(good)
stat = snapshot.statistics("traceback")[0]
diff = snapshot.compare_to(other, "lineno")[0]
traceback = stat.traceback
frame = traceback[0]
filters = [alloctrace.Filter(False, "*nothing*"), alloctrace.DomainFilter(True, 0)]

def get_object_traceback():
    kept = bytearray(1000)
    return alloctrace.get_object_traceback(kept)

NONE = ()
OPERATIONS = {
    # Called as the API's Python functions are: from a lambda, through one more frame.
    "control": (lambda: raising(), ValueError, None),
    "tracemalloc_alongside": (start_alongside, RuntimeError, tracemalloc),
    "start_70000": (lambda: alloctrace.start(70000), ValueError, None),
    "start_not_an_int": (lambda: alloctrace.start("x"), TypeError, None),
    "start_bad_interval": (lambda: alloctrace.start(1, sample_interval=-1), ValueError, None),
    "start_bad_limit": (
        lambda: alloctrace.start(1, memory_limit="lots", memory_limit_dump="x"), ValueError, None
    ),
    "stop": (alloctrace.stop, NONE, None),
    "set_traceback_limit": (lambda: alloctrace.set_traceback_limit(0), ValueError, None),
    "get_traceback_limit": (alloctrace.get_traceback_limit, NONE, alloctrace),
    "take_snapshot": (alloctrace.take_snapshot, NONE, alloctrace),
    "take_snapshot_not_tracing": (alloctrace.take_snapshot, RuntimeError, None),
    "get_traced_memory": (alloctrace.get_traced_memory, NONE, alloctrace),
    "get_tracemalloc_memory": (alloctrace.get_tracemalloc_memory, NONE, alloctrace),
    "get_object_traceback": (get_object_traceback, NONE, alloctrace),
    "clear_traces": (alloctrace.clear_traces, NONE, alloctrace),
    "load": (lambda: alloctrace.Snapshot.load(good), NONE, None),
    "load_missing": (lambda: alloctrace.Snapshot.load("/nonexistent"), OSError, None),
    "load_corrupt": (lambda: alloctrace.Snapshot.load(bad), ValueError, None),
    "dump": (lambda: snapshot.dump(good + ".out"), NONE, None),
    "dump_no_directory": (lambda: snapshot.dump("/nonexistent/x.snap"), OSError, None),
    "snapshot_attributes": (
        lambda: (
            snapshot.metadata, snapshot.machine, snapshot.process_memory,
            snapshot.traceback_limit, snapshot.sample_interval,
        ),
        NONE,
        None,
    ),
    "statistics_lineno": (lambda: snapshot.statistics("lineno"), NONE, None),
    "statistics_traceback": (lambda: snapshot.statistics("traceback"), NONE, None),
    "statistics_cumulative": (
        lambda: snapshot.statistics("filename", cumulative=True), NONE, None
    ),
    "statistics_bad_key": (lambda: snapshot.statistics("bogus"), ValueError, None),
    "compare_to": (lambda: snapshot.compare_to(other, "lineno"), NONE, None),
    "compare_to_traceback": (lambda: snapshot.compare_to(other, "traceback"), NONE, None),
    "filter_traces": (lambda: snapshot.filter_traces(filters), NONE, None),
    "filter_traces_bad": (lambda: snapshot.filter_traces([1]), TypeError, None),
    "traces": (lambda: list(snapshot.traces), NONE, None),
    "trace": (lambda: (repr(snapshot.traces[0]), snapshot.traces[0].size), NONE, None),
    "statistics_repr": (lambda: (repr(stat), str(stat), repr(diff), str(diff)), NONE, None),
    "traceback_format": (lambda: traceback.format(limit=3, most_recent_first=True), NONE, None),
    "traceback": (
        lambda: (repr(traceback), str(traceback), hash(traceback), traceback[0:2]),
        NONE,
        None,
    ),
    "frame": (lambda: (repr(frame), str(frame), frame.filename, hash(frame)), NONE, None),
}
"""

NO_MEMORY_NAMES = [
    "tracemalloc_alongside", "start_70000", "start_not_an_int", "start_bad_interval",
    "start_bad_limit", "stop", "set_traceback_limit", "get_traceback_limit", "take_snapshot",
    "take_snapshot_not_tracing", "get_traced_memory", "get_tracemalloc_memory",
    "get_object_traceback", "clear_traces", "load", "load_missing", "load_corrupt", "dump",
    "dump_no_directory", "snapshot_attributes", "statistics_lineno", "statistics_traceback",
    "statistics_cumulative", "statistics_bad_key", "compare_to", "compare_to_traceback",
    "filter_traces", "filter_traces_bad", "traces", "trace", "statistics_repr",
    "traceback_format", "traceback", "frame",
]  # fmt: skip

#: The interpreter's own SystemError (see above).
FRAME_LOST = "SystemError: error return without exception set"
#: Up to 3.10, the eval loop's own check of a Python frame that returned NULL with no exception
#: set; it names no function, where one of ours would be named ("<built-in method raw_traces
#: ...> returned NULL without setting an error"). Seen once in CI on 3.9, in `traces` (a
#: generator's frame, 1 of 450 attempts); 40 runs of the whole sweep did not show it again,
#: nor did a pure-Python generator under 10,000 failed allocations, so no control stands for it.
EVAL_LOOP_LOST = "SystemError: _PyEval_EvalFrameDefault returned NULL without setting an error"

# Some interpreters crash by themselves here (SIGSEGV in clear_thread_frame, called by
# _PyEvalFramePushAndInit when a frame cannot be set up: CPython 3.12.1 and 3.13.0 seen) when
# a pure-Python Sequence's __getitem__ is called with a slice: Traceback's is such a method.
# Where this control crashes, the Traceback operations are not swept.
SEQUENCE_CONTROL = """
import _testcapi
from collections.abc import Sequence

class Items(Sequence):
    __slots__ = ("_items",)
    def __init__(self, items):
        self._items = tuple(items)
    def __len__(self):
        return len(self._items)
    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(str(item) for item in self._items[index])
        return str(self._items[index])

items = Items([1, 2, 3])
for start in range(300):
    try:
        _testcapi.set_nomemory(start, start + 1)
        try:
            items[0:2]
        finally:
            _testcapi.remove_mem_hooks()
    except (MemoryError, SystemError):
        pass
"""
SEQUENCE_OPERATIONS = {"traceback", "traceback_format"}


def interpreter_survives_sequence_slices():
    child = subprocess.run(
        [sys.executable, "-c", SEQUENCE_CONTROL], env=clean_env(), capture_output=True, timeout=60
    )
    return child.returncode == 0


@pytest.fixture(scope="module")
def no_memory_sweep():
    pytest.importorskip("_testcapi")
    names = NO_MEMORY_NAMES
    if not interpreter_survives_sequence_slices():
        names = [name for name in names if name not in SEQUENCE_OPERATIONS]
    script = textwrap.dedent(NO_MEMORY_OPERATIONS) + textwrap.dedent(NO_MEMORY_SWEEP)
    child = subprocess.run(
        [sys.executable, "-c", script, "control", *names],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert child.returncode == 0, f"exit status {child.returncode}\n{child.stderr[-3000:]}"
    assert "panic" not in child.stderr.lower(), child.stderr[-3000:]
    return json.loads(child.stdout)


@pytest.mark.parametrize("name", NO_MEMORY_NAMES)
def test_api_entry_points_survive_failed_allocations(no_memory_sweep, name):
    if name not in no_memory_sweep:
        pytest.skip("this interpreter crashes by itself on a pure-Python Sequence slice here")
    attempts, outcomes = no_memory_sweep[name]
    _, control = no_memory_sweep["control"]
    # The control: a pure-Python function raising gives ValueError or MemoryError, and on
    # some versions the interpreter's SystemError; nothing else.
    assert set(control) <= {"expected: ValueError", "MemoryError", FRAME_LOST}, control
    allowed = {"ok", "MemoryError"} | ({FRAME_LOST} if FRAME_LOST in control else set())
    if sys.version_info < (3, 11):
        allowed.add(EVAL_LOOP_LOST)
    unexpected = {o for o in outcomes if o not in allowed and not o.startswith("expected: ")}
    assert not unexpected, (name, outcomes)
    # Every allocation point was met: the sweep ended on 40 attempts that failed none.
    assert attempts < 5000, (name, outcomes)
