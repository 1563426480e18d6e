"""``ALLOCTRACE_MEMORY_LIMIT``: parsing, reading the cgroup's limit from fixture files (a fake
root), and real processes that cross a traced or resident limit or die of a MemoryError."""

import os
import textwrap
import time

import pytest

import alloctrace
from alloctrace._memory_limit import cgroup_memory_limit, parse_memory_limit, resolve
from alloctrace._startup import ConfigError
from subproc import numbered_name
from subproc import run_python as run

MiB = 1 << 20


@pytest.mark.parametrize(
    "value, traced, rss, fraction",
    [
        ("512MiB", 512 * MiB, None, None),
        ("traced:1g", 1 << 30, None, None),
        (" rss:2GiB ", None, 2 << 30, None),
        ("cgroup:0.9", None, None, 0.9),
        ("cgroup:1", None, None, 1.0),
        ("100MiB,rss:1GiB", 100 * MiB, 1 << 30, None),
        ("RSS:1k, Traced:2k", 2048, 1024, None),
        ("traced:64m,cgroup:0.5", 64 * MiB, None, 0.5),
    ],
)
def test_accepted_forms(value, traced, rss, fraction):
    limit = parse_memory_limit(value)
    assert (limit.traced, limit.rss, limit.cgroup_fraction) == (traced, rss, fraction)


@pytest.mark.parametrize(
    "value",
    ["", "0", "rss:0", "12x", "heap:1GiB", "rss:", "cgroup:0", "cgroup:1.5", "cgroup:-0.2",
     "cgroup:nan", "cgroup:1GiB", "1GiB,2GiB", "rss:1GiB,cgroup:0.5", "1GiB,", "-5",
     # Issue 61 item 8: sizes beyond 64 bits.
     "18446744073709551616", "rss:18446744073709551616", "traced:16EiB", "99999999.5EiB"],
)  # fmt: skip
def test_refused_forms_name_the_setting_and_the_forms(value):
    with pytest.raises(ConfigError) as info:
        parse_memory_limit(value)
    message = str(info.value)
    assert message.startswith(f"ALLOCTRACE_MEMORY_LIMIT={value!r} is invalid")
    assert "rss:SIZE" in message and "cgroup:FRACTION" in message


def fake_root(tmp_path, cgroup, mountinfo, files):
    """A directory standing for ``/``: /proc/self/cgroup, /proc/self/mountinfo and *files*
    (path -> content)."""
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(textwrap.dedent(cgroup))
    (proc / "mountinfo").write_text(textwrap.dedent(mountinfo))
    for path, content in files.items():
        target = tmp_path / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    return str(tmp_path)


V2_CGROUP = "0::/user.slice/app.scope\n"
V2_MOUNTS = """\
    22 1 0:21 / /proc rw - proc proc rw
    35 23 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
"""
V1_CGROUP = """\
    12:cpu,cpuacct:/docker/abc
    4:memory:/docker/abc
    1:name=systemd:/docker/abc
    0::/
"""
V1_MOUNTS = """\
    40 31 0:37 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct
    41 31 0:38 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory
"""
V2 = "/sys/fs/cgroup/user.slice"


@pytest.mark.parametrize(
    "cgroup, mountinfo, files, expected",
    [
        # v2: the process's own cgroup sets the limit.
        (V2_CGROUP, V2_MOUNTS, {f"{V2}/app.scope/memory.max": "1073741824\n"}, 1 << 30),
        # v2: "max" in the process's cgroup, a limit in its parent: the parent's applies.
        (
            V2_CGROUP,
            V2_MOUNTS,
            {f"{V2}/app.scope/memory.max": "max\n", f"{V2}/memory.max": "536870912\n"},
            512 * MiB,
        ),
        # v2: the smallest limit along the path wins.
        (
            V2_CGROUP,
            V2_MOUNTS,
            {f"{V2}/app.scope/memory.max": "300000000\n", f"{V2}/memory.max": "400000000\n"},
            300000000,
        ),
        # v2: "max" all the way up: no limit.
        (V2_CGROUP, V2_MOUNTS, {f"{V2}/app.scope/memory.max": "max\n"}, None),
        # v2 in a cgroup namespace: the process sees itself at the root of the mount.
        ("0::/\n", V2_MOUNTS, {"/sys/fs/cgroup/memory.max": "268435456\n"}, 256 * MiB),
        # v1: the mount shows the container's subtree, whose path is stripped.
        (
            V1_CGROUP,
            V1_MOUNTS,
            {"/sys/fs/cgroup/memory/memory.limit_in_bytes": "2147483648\n"},
            2 << 30,
        ),
        # v1: no limit is a huge number.
        (
            V1_CGROUP,
            V1_MOUNTS,
            {"/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"},
            None,
        ),
        # v1 without a memory controller mounted: the v2 hierarchy is used.
        (
            "4:memory:/x\n0::/user.slice/app.scope\n",
            V2_MOUNTS,
            {f"{V2}/app.scope/memory.max": "1048576\n"},
            MiB,
        ),
        # No cgroup with a memory controller at all.
        ("1:cpu:/\n", V1_MOUNTS, {}, None),
        # A mount point with a blank, escaped by the kernel as \040.
        (
            "0::/a\n",
            "35 23 0:30 / /sys/fs/my\\040cgroup rw - cgroup2 cgroup2 rw\n",
            {"/sys/fs/my cgroup/a/memory.max": "4096\n"},
            4096,
        ),
    ],
)
def test_cgroup_limit_from_fixture_files(tmp_path, cgroup, mountinfo, files, expected):
    root = fake_root(tmp_path, cgroup, mountinfo, files)
    limit, where = cgroup_memory_limit(root)
    assert limit == expected, where
    if expected is None:
        assert where


def test_no_proc_files_means_no_limit(tmp_path):
    limit, why = cgroup_memory_limit(str(tmp_path))
    assert limit is None and "/proc/self/cgroup" in why


def test_cgroup_fraction_resolves_to_resident_bytes(tmp_path):
    root = fake_root(tmp_path, V2_CGROUP, V2_MOUNTS, {f"{V2}/app.scope/memory.max": "1000\n"})
    assert resolve(parse_memory_limit("cgroup:0.9,5MiB"), root) == (5 * MiB, 900, None)
    unlimited = fake_root(tmp_path / "u", V2_CGROUP, V2_MOUNTS, {})
    traced, rss, note = resolve(parse_memory_limit("cgroup:0.9"), unlimited)
    assert (traced, rss) == (None, None)
    assert note.startswith("memory limit cgroup:0.9: ") and "not watched" in note


# Grows to 24 MiB (traced) in 1 MiB steps, frees it, grows again, then waits for the
# snapshot file the crossing must produce while it still runs.
GROWER = """\
import os, sys, time
blocks = [bytearray(1 << 20) for _ in range(24)]
del blocks[:]
blocks = [bytearray(1 << 20) for _ in range(24)]
del blocks[:]
deadline = time.monotonic() + 30
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.01)
print("running after the snapshot:", os.path.exists(sys.argv[1]))
"""


def test_traced_limit_writes_one_snapshot_with_its_peak_and_the_program_runs_on(tmp_path):
    script = tmp_path / "grow.py"
    script.write_text(GROWER)
    dump = tmp_path / "app.snap"
    result = run(
        [str(script), numbered_name(dump, 1)],
        cwd=tmp_path,
        ALLOCTRACE_DUMP=str(dump),
        ALLOCTRACE_MEMORY_LIMIT="16MiB",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "running after the snapshot: True\n"
    assert "traced memory reached" in result.stderr
    assert f"(memory limit 16MiB): snapshot written to {numbered_name(dump, 1)}" in result.stderr
    # Once: the second climb past the limit wrote nothing more; the exit snapshot is apart.
    assert sorted(os.listdir(tmp_path)) == ["app.1.snap", "app.snap", "grow.py"]
    snapshot = alloctrace.Snapshot.load(numbered_name(dump, 1))
    peak = snapshot.peak
    assert peak is not None
    at_line = {
        s.traceback[0].lineno: s.size
        for s in peak.statistics("lineno")
        if s.traceback[0].filename == str(script)
    }
    # Written during a climb (line 2 or 4) or after it: at least the limit was alive then.
    assert max(at_line.values()) >= 16 * MiB


def test_resident_limit(tmp_path):
    script = tmp_path / "touch.py"
    # b"x" * n writes every page, so they are all resident.
    script.write_text(
        "import os, sys, time\n"
        "data = b'x' * (200 << 20)\n"
        "deadline = time.monotonic() + 30\n"
        "while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
    )
    dump = tmp_path / "app.snap"
    result = run(
        [str(script), numbered_name(dump, 1)],
        cwd=tmp_path,
        ALLOCTRACE_DUMP=str(dump),
        ALLOCTRACE_MEMORY_LIMIT="rss:150MiB,traced:1GiB",
    )
    assert result.returncode == 0, result.stderr
    assert "resident memory (peak RSS) reached" in result.stderr
    snapshot = alloctrace.Snapshot.load(numbered_name(dump, 1))
    assert sum(s.size for s in snapshot.statistics("filename")) >= 200 << 20


def test_uncaught_memory_error_in_a_thread_writes_the_snapshot(tmp_path):
    script = tmp_path / "oom.py"
    script.write_text(
        "import threading\n"
        "def work():\n"
        "    raise MemoryError\n"
        "t = threading.Thread(target=work, name='worker')\n"
        "t.start(); t.join()\n"
        "print('main goes on')\n"
    )
    dump = tmp_path / "app.snap"
    result = run(
        [str(script)], cwd=tmp_path, ALLOCTRACE_DUMP=str(dump), ALLOCTRACE_MEMORY_LIMIT="1GiB"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "main goes on\n"
    assert (
        f"an uncaught MemoryError in thread 'worker': snapshot written to {numbered_name(dump, 1)}"
        in result.stderr
    )
    # The thread's traceback is still printed by the hook we chained to.
    assert "Traceback" in result.stderr and "MemoryError" in result.stderr
    assert alloctrace.Snapshot.load(numbered_name(dump, 1)).peak is not None


def test_uncaught_memory_error_in_the_main_thread(tmp_path):
    dump = tmp_path / "app.snap"
    result = run(
        ["-c", "raise MemoryError('out')"],
        cwd=tmp_path,
        ALLOCTRACE_DUMP=str(dump),
        ALLOCTRACE_MEMORY_LIMIT="1GiB",
    )
    assert result.returncode == 1
    assert f"an uncaught MemoryError: snapshot written to {numbered_name(dump, 1)}" in result.stderr
    assert "MemoryError: out" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["app.1.snap", "app.snap"]


@pytest.mark.parametrize(
    "env, expected",
    [
        (
            {"ALLOCTRACE_DUMP": "x.snap", "ALLOCTRACE_MEMORY_LIMIT": "lots"},
            "alloctrace: ALLOCTRACE_MEMORY_LIMIT='lots' is invalid: expected SIZE or traced:SIZE",
        ),
        (
            {"ALLOCTRACE_MEMORY_LIMIT": "1GiB"},
            "alloctrace: ALLOCTRACE_MEMORY_LIMIT is set but ALLOCTRACE_DUMP is not",
        ),
    ],
)
def test_configuration_errors_stop_before_the_program(tmp_path, env, expected):
    result = run(["-c", "print('ran')"], cwd=tmp_path, **env)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(expected) and result.stderr.count("\n") == 1
    assert os.listdir(tmp_path) == []


def test_run_memory_limit_option(tmp_path):
    script = tmp_path / "grow.py"
    script.write_text(GROWER)
    result = run(
        ["-m", "alloctrace", "run", "-q", "--memory-limit", "traced:16MiB", "-o", "r.snap"]
        + [str(script), str(tmp_path / "r.1.snap")],
        cwd=tmp_path,
        # An inherited setting is not passed on: the option's is.
        ALLOCTRACE_MEMORY_LIMIT="1GiB",
    )
    assert result.returncode == 0, result.stderr
    assert "(memory limit traced:16MiB): snapshot written to" in result.stderr
    assert alloctrace.Snapshot.load(str(tmp_path / "r.1.snap")).peak is not None
    assert (tmp_path / "r.snap").exists()


@pytest.mark.parametrize("value", ["rss:", "18446744073709551616", "rss:18446744073709551616"])
def test_run_memory_limit_option_refuses_bad_values(tmp_path, value):
    result = run(["-m", "alloctrace", "run", "--memory-limit", value, "-c", "pass"], cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(f"alloctrace: error: --memory-limit {value!r} is invalid")
    assert len(result.stderr.splitlines()) == 1 and os.listdir(tmp_path) == []


def wait_for(path, seconds=30):
    import time

    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.path.exists(path)


def test_start_with_a_memory_limit_in_code(tmp_path, capfd):
    alloctrace.stop()
    target = tmp_path / "limit-{pid}.snap"
    alloctrace.start(memory_limit=8 * MiB, memory_limit_dump=target)
    try:
        blocks = [bytearray(MiB) for _ in range(12)]
        del blocks
        written = tmp_path / f"limit-{os.getpid()}.snap"
        assert wait_for(written)
        peak = alloctrace.Snapshot.load(str(written)).peak
        # Written during the climb or after it: at least the limit was alive at the peak.
        assert sum(s.size for s in peak.statistics("filename")) >= 8 * MiB
        # The watcher thread says so once the file is in place: wait for that too (it was
        # once printed after this test had read its output, on a loaded machine).
        message = f"(memory_limit='{8 * MiB}'): snapshot written to {written}"
        err, deadline = "", time.monotonic() + 30
        while message not in err and time.monotonic() < deadline:
            time.sleep(0.01)
            err += capfd.readouterr().err
    finally:
        alloctrace.stop()
    assert message in err


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"memory_limit": 1.5, "memory_limit_dump": "x"}, TypeError, "must be an int"),
        ({"memory_limit": True, "memory_limit_dump": "x"}, TypeError, "must be an int"),
        ({"memory_limit": 0, "memory_limit_dump": "x"}, ValueError, "bytes > 0, not 0"),
        ({"memory_limit": "rss:x", "memory_limit_dump": "x"}, ValueError, "memory_limit 'rss:x'"),
        ({"memory_limit": "1GiB"}, TypeError, "memory_limit needs memory_limit_dump"),
        ({"memory_limit_dump": "x"}, TypeError, "must be an int"),
        ({"memory_limit": 1, "memory_limit_dump": "{x}"}, ValueError, "unknown placeholder"),
        # Issue 61 item 8: more than 64 bits of bytes were an OverflowError from a thread.
        ({"memory_limit": 2**64, "memory_limit_dump": "x"}, ValueError, "memory_limit must be"),
        ({"memory_limit": "rss:16EiB", "memory_limit_dump": "x"}, ValueError, "memory_limit "),
    ],
)
def test_start_refuses_bad_memory_limits(kwargs, error, message):
    alloctrace.stop()
    with pytest.raises(error, match=message):
        alloctrace.start(**kwargs)
    assert not alloctrace.is_tracing()


def test_largest_limits_are_accepted():
    limit = parse_memory_limit("18446744073709551615,rss:15EiB")
    assert (limit.traced, limit.rss) == ((1 << 64) - 1, 15 << 60)


def test_a_cgroup_note_names_the_argument_the_limit_came_from(tmp_path, capfd, monkeypatch):
    # Issue 61 item 8: the note named ALLOCTRACE_MEMORY_LIMIT for a limit given to start().
    from alloctrace import _memory_limit

    monkeypatch.setattr(_memory_limit, "cgroup_memory_limit", lambda root="/": (None, "no limit"))
    alloctrace.stop()
    alloctrace.start(memory_limit="cgroup:0.5", memory_limit_dump=tmp_path / "x.snap")
    alloctrace.stop()
    err = capfd.readouterr().err
    note = "memory_limit='cgroup:0.5': no limit; resident memory is not watched"
    assert err == f"alloctrace: {note}\n"


def test_memory_limit_cannot_be_set_while_tracing(tmp_path):
    alloctrace.start()
    try:
        with pytest.raises(RuntimeError, match="call stop"):
            alloctrace.start(memory_limit=MiB, memory_limit_dump=str(tmp_path / "x"))
    finally:
        alloctrace.stop()


def test_a_crossing_just_before_exit_still_writes_its_snapshot(tmp_path):
    dump = tmp_path / "app.snap"
    result = run(
        ["-c", "data = bytearray(20 << 20)"],
        cwd=tmp_path,
        ALLOCTRACE_DUMP=str(dump),
        ALLOCTRACE_MEMORY_LIMIT="16MiB",
    )
    assert result.returncode == 0, result.stderr
    assert f"snapshot written to {numbered_name(dump, 1)}" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["app.1.snap", "app.snap"]


def test_the_shipped_example(tmp_path):
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "memory_limit.py")
    result = run(
        ["-m", "alloctrace", "run", "-q", "--memory-limit", "32MiB", "-o", "ex.snap", example],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "served 165750000 bytes, 1200 reports cached\n"
    assert f"(memory limit 32MiB): snapshot written to {tmp_path}/ex.1.snap" in (result.stderr)
    stats = run(["-m", "alloctrace", "stats", "--peak", "--limit", "1", "ex.1.snap"], cwd=tmp_path)
    assert stats.returncode == 0, stats.stderr
    assert "memory_limit.py:16: " in stats.stdout


def test_start_without_a_limit_ends_the_previous_one(tmp_path):
    import time

    target = tmp_path / "old.snap"
    alloctrace.stop()
    alloctrace.start(memory_limit=4 * MiB, memory_limit_dump=str(target))
    alloctrace.stop()
    alloctrace.start()  # at once: the old watcher may not have seen the stop
    try:
        data = bytearray(8 * MiB)
        time.sleep(0.2)
    finally:
        alloctrace.stop()
    assert len(data) == 8 * MiB and not target.exists()
