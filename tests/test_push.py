"""Profiles pushed to a Pyroscope-compatible server (``ALLOCTRACE_PUSH``, ``start_push``,
``alloctrace push``), received by a loopback stand-in (:class:`pushwire.Receiver`) that decodes
every request with the push and pprof schemas; and the failures that must not reach the
program: a server down, failing, stalled, talking garbage or hanging up."""

import base64
import gzip
import os
import platform
import shutil
import socket
import subprocess
import textwrap
import time
from urllib.parse import parse_qs, urlsplit

import pytest

import alloctrace
from alloctrace import _push
from pushwire import CONNECT, Receiver, fields, profile, push_request
from subproc import run_python

#: The program the start-up tests push from: ~41 MB of 1000-byte objects kept alive on one
#: line, then freed; it prints its pid, the exact bytes of what it kept, and the times it had
#: built them and freed them.
PROGRAM = textwrap.dedent(
    """
    import os, sys, time
    def build():
        return [bytes(1000) for _ in range(40000)]  # KEEP
    keep = build()
    kept = sum(sys.getsizeof(b) for b in keep)
    built_at = time.time_ns()
    time.sleep(float(sys.argv[1]))
    del keep
    print(os.getpid(), kept, built_at, time.time_ns())
    """
)

FAST = {"ALLOCTRACE_PUSH_INTERVAL": "0.2", "ALLOCTRACE_PUSH_TIMEOUT": "0.5"}

#: The sample types of a pushed profile, in Go's and pyroscope-io's order.
ALL_TYPES = [
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
]


def run_program(tmp_path, url, seconds="0.6", **env):
    script = tmp_path / "app.py"
    script.write_text(PROGRAM)
    began = time.monotonic()
    done = run_python([str(script), seconds], cwd=tmp_path, ALLOCTRACE_PUSH=url, **env)
    return done, time.monotonic() - began


def keep_line_bytes(prof) -> int:
    """In-use bytes of the samples whose leaf is the KEEP line."""
    line = PROGRAM.splitlines().index(next(x for x in PROGRAM.splitlines() if "# KEEP" in x))
    total = 0
    index = prof["sample_type"].index(("inuse_space", "bytes"))
    for sample in prof["samples"]:
        leaf = sample["stack"][0][0]
        if leaf[0]["filename"].endswith("app.py") and leaf[1] == line + 1:
            total += sample["values"][index]
    return total


def test_connect_push_labels_profile_and_totals(tmp_path):
    started = time.time_ns()
    with Receiver("connect") as receiver:
        done, _ = run_program(
            tmp_path,
            receiver.url,
            seconds="1.2",
            ALLOCTRACE_SAMPLE_INTERVAL="64KiB",
            ALLOCTRACE_SERVICE="shop.api",
            ALLOCTRACE_TAGS="env=test, region=eu",
            ALLOCTRACE_PUSH_USER="stack-1",
            ALLOCTRACE_PUSH_PASSWORD="s3cret",
            ALLOCTRACE_PUSH_TENANT="tenant-7",
            **FAST,
        )
        pushes = receiver.pushes()
        paths = {path for path, _, _ in receiver.requests}
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    pid, kept, built_at, freed_at = map(int, done.stdout.split())
    assert paths == {CONNECT}
    assert len(pushes) >= 3
    for push in pushes:
        headers = push["headers"]
        assert headers["content-type"] == "application/proto"
        assert headers["content-encoding"] == "gzip"
        assert headers["authorization"] == "Basic " + base64.b64encode(b"stack-1:s3cret").decode()
        assert headers["x-scope-orgid"] == "tenant-7"
        assert push["labels"] == {
            "__name__": "memory",
            "service_name": "shop.api",
            "host": socket.gethostname(),
            "pid": str(pid),
            "process.runtime.name": "cpython",
            "process.runtime.version": platform.python_version(),
            "alloctrace_version": alloctrace.__version__,
            "env": "test",
            "region": "eu",
        }
        assert "s3cret" not in repr(push["labels"])
        prof = push["profile"]
        assert prof["sample_type"] == ALL_TYPES
        assert prof["default_sample_type"] == "inuse_space"
        assert prof["period_type"] == ("space", "bytes")
        assert prof["period"] == 64 * 1024
        assert started <= prof["time_nanos"] and prof["duration_nanos"] > 0
    assert len({push["id"] for push in pushes}) == len(pushes)
    # The intervals follow one another without gaps or overlaps, the last one ending at exit.
    spans = sorted((p["profile"]["time_nanos"], p["profile"]["duration_nanos"]) for p in pushes)
    for (start, length), (next_start, _) in zip(spans, spans[1:]):
        assert start + length == next_start
    assert spans[-1][0] + spans[-1][1] >= freed_at
    # While the objects were alive, the estimate of their line is within sampling error
    # (relative standard error sqrt(64 KiB / 41 MB) = 4%) of their exact size.
    during = [
        p
        for p in pushes
        if built_at <= p["profile"]["time_nanos"]
        and p["profile"]["time_nanos"] + p["profile"]["duration_nanos"] < freed_at
    ]
    assert during
    for push in during:
        assert abs(keep_line_bytes(push["profile"]) - kept) < 0.2 * kept
    # The last profile, taken at exit, no longer holds them.
    assert keep_line_bytes(pushes[-1]["profile"]) < 0.2 * kept


def test_defaults_when_pushing(tmp_path):
    with Receiver("connect") as receiver:
        done, _ = run_program(tmp_path, receiver.url, seconds="0.3", **FAST)
        pushes = receiver.pushes()
    assert done.returncode == 0, done.stderr
    assert pushes
    last = pushes[-1]
    assert last["profile"]["period"] == 512 * 1024
    assert last["labels"]["service_name"] == "app"
    assert "authorization" not in last["headers"]
    assert "x-scope-orgid" not in last["headers"]
    # ALLOCTRACE_PUSH traces with 64 frames (ALLOCTRACE=1 would keep the leaf alone).
    names = {
        frame[0]["name"]
        for push in pushes
        for sample in push["profile"]["samples"]
        for location in sample["stack"]
        for frame in location
    }
    assert {"build", "<module>"} <= names


def test_ingest_fallback_is_chosen_once(tmp_path):
    with Receiver("ingest") as receiver:
        done, _ = run_program(
            tmp_path, receiver.url, ALLOCTRACE_SERVICE="old", ALLOCTRACE_TAGS="env=x", **FAST
        )
        requests = list(receiver.requests)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    pid = int(done.stdout.split()[0])
    paths = [urlsplit(path).path for path, _, _ in requests]
    assert paths[0] == CONNECT
    assert paths[1:] and set(paths[1:]) == {"/ingest"}
    for path, _headers, body in requests[1:]:
        query = parse_qs(urlsplit(path).query)
        assert query["format"] == ["pprof"]
        name = query["name"][0]
        assert name.startswith("old{") and f"pid={pid}" in name and "env=x" in name
        assert int(query["from"][0]) <= int(query["until"][0])
        assert body[:2] == b"\x1f\x8b"
        prof = profile(body)
        assert prof["sample_type"] == ALL_TYPES
        assert prof["period"] == 512 * 1024


def _refused_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("mode", ["down", "500", "stall", "garbage", "close"])
def test_failing_server_costs_one_warning(tmp_path, mode):
    """The program ends as it would, with one line on stderr; a 10-second stall does not hold
    it (requests time out after 0.5 s, and the exit push is skipped after a failure)."""
    if mode == "down":
        done, elapsed = run_program(tmp_path, _refused_url(), **FAST)
        attempts = None
    else:
        with Receiver(mode, stall=10.0) as receiver:
            done, elapsed = run_program(tmp_path, receiver.url, **FAST)
            attempts = receiver.attempts
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 4
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("alloctrace: cannot push memory profiles to http://127.0.0.1:")
    if attempts is not None:
        assert attempts >= 1
    # The program sleeps 0.6 s; its start-up and our checks are well under 5 s even on a busy
    # machine, while waiting for the stalled server would take 10.
    assert elapsed < 8.0


def test_start_push_api_and_status(tmp_path):
    code = textwrap.dedent(
        """
        import sys, time, alloctrace
        alloctrace.start(16, sample_interval=4096, push=sys.argv[1])
        keep = [bytearray(5000) for _ in range(2000)]
        time.sleep(0.5)
        alloctrace.stop_push()
        status = alloctrace.get_push_status()
        print(status["pushed"], status["failed"], status["dropped"], status["api"],
              status["snapshot_seconds_max"] > 0)
        """
    )
    with Receiver("connect") as receiver:
        done = run_python(
            ["-c", code, receiver.url], ALLOCTRACE_PUSH_INTERVAL="0.2", ALLOCTRACE_SERVICE="api"
        )
        pushes = receiver.pushes()
    assert done.returncode == 0, done.stderr
    pushed, failed, dropped, api, timed = done.stdout.split()
    assert int(pushed) == len(pushes) >= 2
    assert (failed, dropped, api, timed) == ("0", "0", "connect", "True")
    assert pushes[-1]["profile"]["period"] == 4096
    assert pushes[-1]["labels"]["service_name"] == "api"


def test_run_push_passes_on_push_variables_only(tmp_path):
    (tmp_path / "app.py").write_text(PROGRAM)
    with Receiver("connect") as receiver:
        done = run_python(
            [
                "-m",
                "alloctrace",
                "run",
                "-q",
                "-o",
                "app.snap",
                "--push",
                receiver.url,
                "app.py",
                "0.5",
            ],
            cwd=tmp_path,
            ALLOCTRACE_TAGS="team=core",
            ALLOCTRACE_PUSH_TOKEN="tok-1",
            ALLOCTRACE_OBJECTS="1",  # not a push variable: run does not pass it on
            **FAST,
        )
        pushes = receiver.pushes()
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert len(pushes) >= 2
    assert pushes[-1]["labels"]["team"] == "core"
    assert pushes[-1]["labels"]["service_name"] == "app"
    assert pushes[-1]["headers"]["authorization"] == "Bearer tok-1"
    assert pushes[-1]["profile"]["period"] == 512 * 1024
    assert not alloctrace.Snapshot.load(str(tmp_path / "app.snap")).has_objects
    bad = run_python(["-m", "alloctrace", "run", "--push", "nope://x", "app.py"], cwd=tmp_path)
    assert bad.returncode == 2 and "--push" in bad.stderr and bad.stdout == ""


def test_forked_child_pushes_under_its_own_pid(tmp_path):
    code = textwrap.dedent(
        """
        import os, sys, time
        keep = [bytes(800) for _ in range(3000)]
        pid = os.fork()
        if pid == 0:
            more = [bytes(900) for _ in range(3000)]
            time.sleep(0.6)
            sys.exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.3)
        print(os.getpid(), pid)
        """
    )
    with Receiver("connect") as receiver:
        done = run_python(
            ["-W", "ignore::DeprecationWarning", "-c", code],
            ALLOCTRACE_PUSH=receiver.url,
            **FAST,
        )
        pushes = receiver.pushes()
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    parent, child = done.stdout.split()
    pids = {p["labels"]["pid"] for p in pushes}
    assert pids == {parent, child}
    assert sum(p["labels"]["pid"] == child for p in pushes) >= 2


def test_bad_settings_are_refused(tmp_path):
    for env, message in [
        ({"ALLOCTRACE_PUSH": "ftp://x"}, "push URL must be http"),
        ({"ALLOCTRACE_PUSH": "http://h", "ALLOCTRACE_TAGS": "a b=c"}, "is not a tag"),
        ({"ALLOCTRACE_PUSH": "http://h", "ALLOCTRACE_TAGS": "pid=3"}, "set by alloctrace"),
        ({"ALLOCTRACE_PUSH": "http://h", "ALLOCTRACE_PUSH_INTERVAL": "0"}, "at least 0.1"),
        ({"ALLOCTRACE_PUSH": "http://h", "ALLOCTRACE_SERVICE": "a b"}, "service name"),
    ]:
        done = run_python(["-c", "print('ran')"], **env)
        assert done.returncode == 2, (env, done.stderr)
        assert done.stdout == ""
        assert message in done.stderr and "ALLOCTRACE_PUSH" in done.stderr
    with pytest.raises(ValueError, match="push URL"):
        alloctrace.start(1, push="localhost:4040")
    assert not alloctrace.is_tracing()


def test_credentials_never_shown():
    target = _push.Target("https://me:pa%20ss@example.com/pyro/", tenant="t")
    assert target.shown == "https://example.com:443/pyro"
    assert "pa" not in repr(target) and "me" not in target.shown
    assert target.headers()["Authorization"] == "Basic " + base64.b64encode(b"me:pa ss").decode()
    bearer = _push.Target("http://h", token="tok")
    assert bearer.headers()["Authorization"] == "Bearer tok"
    with pytest.raises(ValueError, match="not both"):
        _push.Target("http://u:p@h", token="tok")


def test_push_request_encoding():
    body = push_request_bytes = _push.push_request({"b": "2", "a": "1"}, b"\x01\x02" * 200, "id-1")
    series = push_request(push_request_bytes)
    assert series == [{"labels": {"a": "1", "b": "2"}, "samples": [(b"\x01\x02" * 200, "id-1")]}]
    assert [n for n, _ in fields(body)] == [1]


def test_push_command_uploads_snapshot_files(tmp_path):
    snap = tmp_path / "app.snap"
    made = run_python(
        [
            "-c",
            "import alloctrace, sys; alloctrace.start(5); x = [bytes(1000) for _ in range(2000)]; "
            "alloctrace.take_snapshot().dump(sys.argv[1])",
            str(snap),
        ]
    )
    assert made.returncode == 0, made.stderr
    stamp = alloctrace.Snapshot.load(str(snap)).metadata["timestamp"]
    with Receiver("connect") as receiver:
        done = run_python(
            [
                "-m",
                "alloctrace",
                "push",
                str(snap),
                str(snap),
                "--url",
                receiver.url,
                "--service",
                "batch",
                "--tag",
                "run=7",
            ]
        )
        pushes = receiver.pushes()
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("pushed") == 2
    assert len(pushes) == 2
    labels = pushes[0]["labels"]
    assert labels["service_name"] == "batch" and labels["run"] == "7"
    assert labels["__name__"] == "memory" and "pid" in labels
    assert pushes[0]["profile"]["time_nanos"] == int(stamp * 1e9)
    assert pushes[0]["profile"]["period"] == 1
    # A file records what was alive, not what was allocated: in-use types only.
    assert pushes[0]["profile"]["sample_type"] == ALL_TYPES[2:]
    # A server that does not answer: one line, a failure status, no traceback.
    down = run_python(["-m", "alloctrace", "push", str(snap), "--url", _refused_url()])
    assert down.returncode == 1
    assert len(down.stderr.splitlines()) == 1 and "cannot push" in down.stderr


def test_go_pprof_reads_a_pushed_profile(tmp_path):
    if shutil.which("go") is None:
        pytest.skip("go is not installed (apt-get install golang-go)")
    with Receiver("connect") as receiver:
        done, _ = run_program(tmp_path, receiver.url, seconds="0.5", **FAST)
        pushes = receiver.pushes()
    assert done.returncode == 0, done.stderr
    path = tmp_path / "pushed.pb.gz"
    path.write_bytes(gzip.compress(pushes[0]["raw"]))
    raw = subprocess.run(
        ["go", "tool", "pprof", "-raw", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert raw.returncode == 0, raw.stderr
    assert "alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes" in (
        raw.stdout
    )
    assert "app.py" in raw.stdout


def test_same_shape_as_pyroscope_io(tmp_path):
    """What the real client (PyPI pyroscope-io) sends and what we send: the same path,
    headers, content type and encoding, label names, and the same four sample types in the
    same order."""
    import importlib.util

    if importlib.util.find_spec("pyroscope") is None:
        pytest.skip("pyroscope-io is not installed (it has wheels for CPython 3.10+)")
    code = textwrap.dedent(
        """
        import sys, time, pyroscope
        pyroscope.configure(application_name="ref", server_address=sys.argv[1],
                            upload_interval=1, mem_enabled=True, cpu_enabled=False)
        keep = [bytearray(200000) for _ in range(20)]
        time.sleep(1.5)
        pyroscope.shutdown()
        """
    )
    with Receiver("connect") as receiver:
        done = run_python(["-c", code, receiver.url])
        theirs = receiver.pushes()
    assert done.returncode == 0, done.stderr
    with Receiver("connect") as receiver:
        run_program(tmp_path, receiver.url, seconds="0.3", **FAST)
        ours = receiver.pushes()
    assert theirs and ours
    for header in ("content-type", "content-encoding"):
        assert ours[0]["headers"][header] == theirs[0]["headers"][header]
    shared = {"__name__", "service_name", "process.runtime.name", "process.runtime.version"}
    assert shared <= set(theirs[0]["labels"]) and shared <= set(ours[0]["labels"])
    assert ours[0]["labels"]["__name__"] == theirs[0]["labels"]["__name__"]
    assert ours[0]["profile"]["sample_type"] == theirs[0]["profile"]["sample_type"] == ALL_TYPES
    assert ours[0]["profile"]["period_type"] == theirs[0]["profile"]["period_type"]
    assert ours[0]["raw"][:2] != b"\x1f\x8b" and theirs[0]["raw"][:2] != b"\x1f\x8b"


def test_start_up_defaults_when_pushing():
    from alloctrace._startup import read_config

    config = read_config({"ALLOCTRACE_PUSH": "http://h", "ALLOCTRACE_SAMPLE_SEED": "3"}, {}, False)
    assert (config.nframe, config.sample_interval, config.sample_seed) == (64, 512 * 1024, 3)
    config = read_config(
        {"ALLOCTRACE_PUSH": "http://h", "ALLOCTRACE": "5", "ALLOCTRACE_SAMPLE_INTERVAL": "0"},
        {},
        False,
    )
    assert (config.nframe, config.sample_interval) == (5, None)
    assert read_config({"ALLOCTRACE_PUSH": "http://h", "ALLOCTRACE": "0"}, {}, False).nframe == 0
    assert read_config({"ALLOCTRACE_PUSH": "http://h"}, {}, True).nframe == 0


def line_values(prof, filename_end: str, line: int) -> tuple[int, int, int, int]:
    """``(alloc_objects, alloc_space, inuse_objects, inuse_space)`` of the samples whose leaf
    is *line* of a file named ``...filename_end``."""
    assert prof["sample_type"] == ALL_TYPES
    total = [0, 0, 0, 0]
    for sample in prof["samples"]:
        leaf = sample["stack"][0][0]
        if leaf[0]["filename"].endswith(filename_end) and leaf[1] == line:
            total = [t + v for t, v in zip(total, sample["values"])]
    return tuple(total)


def marked_line(text: str, mark: str) -> int:
    return next(i + 1 for i, x in enumerate(text.splitlines()) if x.endswith(mark))


CHURN_PROGRAM = textwrap.dedent(
    """
    import os, sys, time
    def churn(n):
        for _ in range(n):
            b = bytes(1000)  # CHURN
    def tail(n):
        for _ in range(n):
            b = bytes(2000)  # TAIL
    churn(40000)
    time.sleep(0.8)
    tail(10000)
    print(sys.getsizeof(bytes(1000)), sys.getsizeof(bytes(2000)))
    """
)


def test_alloc_figures_are_per_interval_and_the_exit_profile_has_the_tail(tmp_path):
    """40,000 blocks of ~1 KB allocated and freed at once on one line, then nothing, then
    10,000 of ~2 KB just before exit: the line's alloc_* figures add up, over the profiles,
    to what it allocated (within sampling error: 64 KiB sampling of ~40 MB is a relative
    standard error of 4%, bounded here at 20%), each interval counting only its own (a
    cumulative count would add up to several times as much, and the exit profile would
    still hold the first line's), while its in-use figures stay near zero."""
    script = tmp_path / "app.py"
    script.write_text(CHURN_PROGRAM)
    with Receiver("connect") as receiver:
        done = run_python(
            [str(script)],
            cwd=tmp_path,
            ALLOCTRACE_PUSH=receiver.url,
            ALLOCTRACE_SAMPLE_INTERVAL="64KiB",
            **FAST,
        )
        pushes = receiver.pushes()
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    small, large = map(int, done.stdout.split())
    churn, tail = marked_line(CHURN_PROGRAM, "# CHURN"), marked_line(CHURN_PROGRAM, "# TAIL")
    assert len(pushes) >= 3
    per_push = [
        (line_values(p["profile"], "app.py", churn), line_values(p["profile"], "app.py", tail))
        for p in pushes
    ]
    for name, index, blocks, size in [("churn", 0, 40000, small), ("tail", 1, 10000, large)]:
        objects = sum(values[index][0] for values in per_push)
        space = sum(values[index][1] for values in per_push)
        assert abs(space - blocks * size) < 0.2 * blocks * size, (name, space, per_push)
        assert abs(objects - blocks) < 0.2 * blocks, (name, objects, per_push)
        # Freed as soon as made: at most a block or two alive, which sampling may weigh
        # as 64 KiB each.
        for values in per_push:
            assert values[index][3] <= 2 * 64 * 1024, (name, per_push)
    # The exit profile: the tail, and nothing of the churn long before.
    last_churn, last_tail = per_push[-1]
    assert last_churn[:2] == (0, 0), per_push
    assert last_tail[1] > 0, per_push


def test_alloc_figures_exact_per_push_api_interval(tmp_path):
    """Without sampling the alloc_* figures are exact counts; each stop_push() sends what was
    allocated since the pusher started, and a new pusher starts from zero."""
    code = textwrap.dedent(
        """
        import sys, alloctrace
        from alloctrace import _native
        def churn(n, size):
            for _ in range(n):
                b = bytes(size)  # CHURN
        alloctrace.start(8, sample_interval=0)
        assert not _native._is_counting_allocations()
        churn(500, 300)  # before pushing: not counted
        alloctrace.start_push(sys.argv[1], interval=3600)
        assert _native._is_counting_allocations()
        churn(3000, 1000)
        alloctrace.stop_push()
        assert not _native._is_counting_allocations()
        churn(700, 400)  # between pushers: not counted
        alloctrace.start_push(sys.argv[1], interval=3600)
        churn(1000, 3000)
        alloctrace.stop_push()
        print(sys.getsizeof(bytes(1000)), sys.getsizeof(bytes(3000)))
        """
    )
    with Receiver("connect") as receiver:
        done = run_python(["-c", code, receiver.url])
        pushes = receiver.pushes()
    assert done.returncode == 0, done.stderr
    first, second = map(int, done.stdout.split())
    assert len(pushes) == 2
    line = marked_line(code, "# CHURN")
    one = line_values(pushes[0]["profile"], "<string>", line)
    two = line_values(pushes[1]["profile"], "<string>", line)
    assert pushes[0]["profile"]["period"] == pushes[1]["profile"]["period"] == 1
    assert one[:2] == (3000, 3000 * first), one
    assert two[:2] == (1000, 1000 * second), two
    assert one[2] <= 1 and two[2] <= 1


def test_alloc_counts_keep_their_tracebacks_until_pushed(tmp_path):
    """Tracebacks that nothing alive names are freed by the sweep (and their ids reused),
    but not while their allocations wait to be pushed: 5,000 short-lived code objects each
    allocate and free one block, sweeps run (snapshots, get_traced_memory), and the next
    profile still names every one of them, with its own count. (Without waiting counts, the
    sweeps leave under a thousand of them: see the run without a pusher below. That they are
    freed once taken is checked in src/hooks/peak.rs's tests.)"""
    code = textwrap.dedent(
        """
        import gc, sys, alloctrace
        from alloctrace import _native
        def run(prefix):
            for i in range(5000):
                exec(compile("b = bytes(%d)" % (600 + i % 7), prefix + str(i), "exec"), {})
            gc.collect()
            for _ in range(3):
                alloctrace.take_snapshot()
                alloctrace.get_traced_memory()
            return _native._sweep_stats()[4]
        alloctrace.start(4, sample_interval=0)
        unpushed = run("before")
        alloctrace.start_push(sys.argv[1], interval=3600)
        waiting = run("dyn")
        alloctrace.stop_push()
        print(sys.getsizeof(bytes(600)) - 600, unpushed, waiting)
        """
    )
    with Receiver("connect") as receiver:
        done = run_python(["-c", code, receiver.url])
        pushes = receiver.pushes()
    assert done.returncode == 0, done.stderr
    overhead, unpushed, waiting = map(int, done.stdout.split())
    # Not counted, most are freed by the sweeps; counted, all 5,000 are kept while waiting.
    assert unpushed < 3000, unpushed
    assert waiting >= 5000, (unpushed, waiting)
    assert len(pushes) == 1
    prof = pushes[0]["profile"]
    found = {}
    for sample in prof["samples"]:
        leaf = sample["stack"][0][0]
        name = leaf[0]["filename"]
        if name.startswith("dyn") and leaf[1] == 1:
            assert name[3:].isdigit()
            objects, space = sample["values"][:2]
            found[name] = found.get(name, (0, 0))
            found[name] = (found[name][0] + objects, found[name][1] + space)
    assert len(found) == 5000
    for i in range(5000):
        # The bytes object, and sometimes a little more that the interpreter allocates on
        # the line (the module dict's growth; 3.9's small objects): never another's counts.
        objects, space = found[f"dyn{i}"]
        assert objects >= 1 and space >= 600 + i % 7 + overhead, (i, found[f"dyn{i}"])
        assert objects <= 64 and space <= 600 + i % 7 + overhead + 16384, (i, found[f"dyn{i}"])


def test_alloc_figures_of_threads_without_the_gil(tmp_path):
    """Blocks that C code allocates after releasing the GIL (lzma's dictionary, allocated
    inside ``decompress``) are counted on the line that called it, like their in-use figures,
    even when freed before any snapshot could move them off the placeholder traceback."""
    code = textwrap.dedent(
        """
        import lzma, sys, threading, alloctrace
        data = lzma.compress(bytes(1 << 20))
        lzma.LZMADecompressor().decompress(data, max_length=1024)  # first use, untraced
        def work():
            for _ in range(10):
                lzma.LZMADecompressor().decompress(data, max_length=1024)  # LZMA
        alloctrace.start(4, sample_interval=0)
        alloctrace.start_push(sys.argv[1], interval=3600)
        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        alloctrace.stop_push()
        """
    )
    with Receiver("connect") as receiver:
        done = run_python(["-c", code, receiver.url])
        pushes = receiver.pushes()
    assert done.returncode == 0, done.stderr
    assert len(pushes) == 1
    prof = pushes[0]["profile"]
    line = line_values(prof, "<string>", marked_line(code, "# LZMA"))
    unknown = line_values(prof, "<unknown>", 0)
    # 20 decompressors, each with a dictionary of at least 1 MiB.
    assert line[1] >= 20 << 20, (line, unknown)
    assert line[0] >= 20
    assert unknown[1] < 1 << 20, (line, unknown)
    assert line[3] < 1 << 20


def test_a_forked_child_counts_its_own_allocations_only(tmp_path):
    """What the parent allocated before fork() belongs to the parent's interval: the child's
    profile starts from zero."""
    code = textwrap.dedent(
        """
        import os, sys, alloctrace
        def churn(n):
            for _ in range(n):
                b = bytes(1000)  # CHURN
        alloctrace.start(4, sample_interval=0)
        alloctrace.start_push(sys.argv[1], interval=3600)
        churn(2000)
        pid = os.fork()
        if pid == 0:
            churn(300)
            sys.exit(0)
        os.waitpid(pid, 0)
        print(os.getpid(), pid)
        """
    )
    with Receiver("connect") as receiver:
        done = run_python(["-W", "ignore::DeprecationWarning", "-c", code, receiver.url])
        pushes = receiver.pushes()
    assert done.returncode == 0, done.stderr
    parent, child = done.stdout.split()
    line = marked_line(code, "# CHURN")
    counts = {}
    for push in pushes:
        pid = push["labels"]["pid"]
        objects = line_values(push["profile"], "<string>", line)[0]
        counts[pid] = counts.get(pid, 0) + objects
    assert counts == {parent: 2000, child: 300}


def test_a_name_server_that_does_not_answer_is_bounded_by_the_timeout(monkeypatch):
    # getaddrinfo has no timeout of ours: a silent name server held each attempt for the
    # resolver's own delays. The lookup is waited for up to the push timeout, and the next
    # attempt waits for the same lookup instead of starting another.
    release = __import__("threading").Event()
    calls = []
    real = socket.getaddrinfo

    def silent(host, *args, **kwargs):
        calls.append(host)
        if host == "stalled.invalid":
            release.wait(30)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", silent)
    sender = _push.Sender(_push.Target("http://stalled.invalid:4040"), timeout=0.3)
    try:
        for _ in range(2):
            began = time.monotonic()
            with pytest.raises(_push.PushError, match="cannot resolve stalled.invalid within"):
                sender.send({"service_name": "x"}, b"", gzip.compress(b""), 0, 1)
            assert time.monotonic() - began < 3
        assert calls == ["stalled.invalid"]
    finally:
        release.set()
    # A name that resolves: the request goes to its address with the name in its Host header.
    with Receiver("connect") as receiver:
        port = urlsplit(receiver.url).port
        sender = _push.Sender(_push.Target(f"http://localhost:{port}"), timeout=5)
        sender.send({"service_name": "x"}, b"", gzip.compress(b""), 0, 1)
        ((_, headers, _),) = receiver.requests
        assert headers["host"] == f"localhost:{port}"
