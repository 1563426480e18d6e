"""Snapshots and reports that travel between machines and people (issue 61): what a crafted
snapshot may make the reader's machine read, the modes outputs are written with, symlinks and
special files at output names, hostile pytest baselines, and the HTML report's smaller cases.
Each case failed before its fix."""

import os
import resource
import socket
import stat
import subprocess
import sys

import pytest

from alloctrace._native import SnapshotData
from alloctrace._snapshot import Snapshot
from subproc import clean_env, run_python

pytestmark = pytest.mark.usefixtures("stopped_tracer")

#: What a hostile case may cost a command: it used to hang (a FIFO) or grow to gigabytes.
TIMEOUT = 30
MEMORY = 1 << 30


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def cli(args, cwd=None, **env):
    """``python -m alloctrace ARGS`` with a time and an address-space limit."""
    try:
        return run_python(
            ["-m", "alloctrace", *map(str, args)],
            cwd,
            timeout=TIMEOUT,
            preexec_fn=_limit_memory,
            **env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"alloctrace {' '.join(map(str, args))} ran for {TIMEOUT}s")


HERE = SnapshotData.this_machine()


def made(traces, machine=HERE):
    """A snapshot of *traces* that says it was taken on *machine* (default: this one, so that
    only the rules about which files are read decide what is shown)."""
    return Snapshot._from_data(SnapshotData.from_raw(traces, 1, None, machine))


def snapshot_naming(tmp_path, *filenames, name="crafted.snap", machine=HERE):
    """A snapshot with one block allocated at line 1 of each of *filenames*."""
    traces = [(0, 1000 * (i + 1), ((str(f), 1),)) for i, f in enumerate(filenames)]
    path = tmp_path / name
    made(traces, machine).dump(path)
    return path


# --- 1. which files source lines come from --------------------------------------------------------

SECRET = "SECRET-61-LINE"


HOSTILE = ["private", "fifo", "zero", "zero-link", "environ", "shadow"]


def hostile_file(tmp_path, kind):
    """A file a crafted snapshot names: a private non-Python file of the reader's, a FIFO,
    /dev/zero (and a .py link to it), a process's environment, the password hashes."""
    if kind == "private":
        private = tmp_path / "private.txt"
        private.write_text(SECRET + "\n")
        private.chmod(0o600)
        return private
    if kind == "fifo":
        os.mkfifo(tmp_path / "pipe.py")
        return tmp_path / "pipe.py"
    if kind == "zero-link":
        (tmp_path / "zero.py").symlink_to("/dev/zero")
        return tmp_path / "zero.py"
    return {"zero": "/dev/zero", "environ": "/proc/self/environ", "shadow": "/etc/shadow"}[kind]


def assert_nothing_leaked(written):
    assert SECRET not in written
    try:
        with open("/etc/shadow") as stream:
            shadow = stream.readline().strip()
    except OSError:
        shadow = ""
    assert not shadow or shadow not in written


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_snapshot_cannot_make_stats_read_special_or_private_files(tmp_path, kind):
    named = hostile_file(tmp_path, kind)
    # 100 lines of it: linecache gives up on /dev/zero at the address-space limit, then reads
    # 1 GiB again for the next line.
    path = tmp_path / "crafted.snap"
    made([(0, 1000 + line, ((str(named), line),)) for line in range(1, 101)]).dump(path)
    result = cli(["stats", path, "--limit", "0"], SECRET_61_VARIABLE=SECRET)
    assert result.returncode == 0, result.stderr
    assert str(named) in result.stdout
    assert_nothing_leaked(result.stdout)


@pytest.mark.parametrize("command", ["top", "diff", "report"])
def test_nor_top_diff_or_report(tmp_path, command):
    path = snapshot_naming(tmp_path, *(hostile_file(tmp_path, kind) for kind in HOSTILE))
    out = tmp_path / "report.html"
    args = {
        "top": ["top", path],
        "diff": ["diff", snapshot_naming(tmp_path, name="empty.snap"), path],
        "report": ["report", path, "-o", out],
    }[command]
    result = cli(args, SECRET_61_VARIABLE=SECRET)
    assert result.returncode == 0, result.stderr
    written = result.stdout + (out.read_text() if command == "report" else "")
    assert "private.txt" in written
    assert_nothing_leaked(written)


def test_python_sources_still_show_their_lines(tmp_path):
    source = tmp_path / "app.py"
    source.write_text("payload = [bytearray(1000) for _ in range(10)]\n")
    script = tmp_path / "tool"
    script.write_text("#!/usr/bin/env python3\nmain()\n")
    path = tmp_path / "app.snap"
    made([(0, 2000, ((str(source), 1),)), (0, 1000, ((str(script), 2),))]).dump(path)
    result = cli(["stats", path])
    assert result.returncode == 0, result.stderr
    assert "    payload = [bytearray(1000) for _ in range(10)]" in result.stdout
    assert "    main()" in result.stdout


def test_source_path_limits_where_lines_are_read(tmp_path):
    inside = tmp_path / "inside"
    outside = tmp_path / "outside"
    for directory in (inside, outside):
        directory.mkdir()
        (directory / "mod.py").write_text(f"x = '{directory.name} line'\n")
    path = snapshot_naming(tmp_path, inside / "mod.py", outside / "mod.py")
    result = cli(["stats", path], ALLOCTRACE_SOURCE_PATH=str(inside))
    assert result.returncode == 0, result.stderr
    assert "inside line" in result.stdout
    assert "outside line" not in result.stdout
    # A link inside the allowed directory does not lead out of it.
    (inside / "out.py").symlink_to(outside / "mod.py")
    path = snapshot_naming(tmp_path, inside / "out.py")
    result = cli(["stats", path], ALLOCTRACE_SOURCE_PATH=str(inside))
    assert "outside line" not in result.stdout


# --- 1b. only for snapshots of this machine, or where the user says -------------------------------

ELSEWHERE = ("0123456789abcdef0123456789abcdef", "build-7.example")
APP_LINE = "payload = [bytearray(1000) for _ in range(10)]  # the reader's version"


@pytest.fixture
def app(tmp_path):
    """A source file of the reader's, named as a frame of the snapshots below names it."""
    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / "app.py"
    source.write_text(APP_LINE + "\n")
    return source


def shown(tmp_path, command, path, *options, **env):
    """What `command` shows of the snapshot at *path*: (stdout + any report, stderr)."""
    out = tmp_path / "report.html"
    args = {
        "stats": ["stats", path],
        "top": ["top", path],
        "diff": ["diff", snapshot_naming(tmp_path, name="empty.snap"), path],
        "report": ["report", path, "-o", out],
    }[command]
    result = cli([*args, *options], **env)
    assert result.returncode == 0, result.stderr
    return result.stdout + (out.read_text() if command == "report" else ""), result.stderr


COMMANDS = ["stats", "top", "diff", "report"]


@pytest.mark.skipif(HERE is None, reason="this machine has no machine id")
@pytest.mark.parametrize("command", COMMANDS)
def test_a_snapshot_from_another_machine_shows_none_of_the_readers_lines(tmp_path, app, command):
    ours = snapshot_naming(tmp_path, app, name="ours.snap")
    theirs = snapshot_naming(tmp_path, app, name="theirs.snap", machine=ELSEWHERE)
    assert APP_LINE in shown(tmp_path, command, ours)[0]
    written, err = shown(tmp_path, command, theirs)
    assert "app.py" in written
    assert APP_LINE not in written
    assert "another machine (build-7.example)" in err
    assert "--source-from DIR" in err


@pytest.mark.parametrize("command", COMMANDS)
def test_the_user_may_name_where_the_lines_of_another_machine_are(tmp_path, app, command):
    theirs = snapshot_naming(tmp_path, app, name="theirs.snap", machine=ELSEWHERE)
    written, err = shown(tmp_path, command, theirs, "--source-from", app.parent)
    assert APP_LINE in written
    assert "not shown" not in err
    # ALLOCTRACE_SOURCE_PATH, set, is the same consent (and the same narrowing).
    written, _ = shown(tmp_path, command, theirs, ALLOCTRACE_SOURCE_PATH=str(app.parent))
    assert APP_LINE in written
    written, _ = shown(tmp_path, command, theirs, "--source-from", tmp_path / "elsewhere")
    assert APP_LINE not in written


def test_snapshots_that_do_not_say_where_they_were_taken_show_no_lines(tmp_path, app):
    # Files from before the machine was recorded, hand-built snapshots, tracemalloc pickles.
    old = snapshot_naming(tmp_path, app, name="old.snap", machine=None)
    written, err = shown(tmp_path, "stats", old)
    assert "app.py" in written and APP_LINE not in written
    assert "does not say which machine" in err
    assert APP_LINE in shown(tmp_path, "stats", old, "--source-from", app.parent)[0]
    # --no-source: nothing to say.
    assert "not shown" not in shown(tmp_path, "stats", old, "--no-source")[1]


@pytest.mark.skipif(HERE is None, reason="this machine has no machine id")
def test_snapshots_record_a_hashed_machine_id_and_the_hostname(tmp_path):
    path = tmp_path / "taken.snap"
    code = (
        "import alloctrace, sys; alloctrace.start(); alloctrace.take_snapshot().dump(sys.argv[1])"
    )
    subprocess.run([sys.executable, "-c", code, path], env=clean_env(), check=True, timeout=60)
    machine = Snapshot.load(path).machine
    assert machine == HERE
    machine_id, hostname = machine
    assert hostname == socket.gethostname()
    assert len(machine_id) == 32 and int(machine_id, 16) >= 0
    for name in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(name) as stream:
                raw = stream.read().strip()
        except OSError:
            continue
        # Never the raw id (systemd: not to be disclosed), nor any part of it in the file.
        assert raw and raw not in path.read_bytes().decode("latin-1")
        assert raw[:12] not in machine_id
    # A copy keeps it; any id a file claims loads as it is (a fidelity guard only).
    made([(0, 1, (("a.py", 1),))], ELSEWHERE).dump(tmp_path / "c.snap")
    assert Snapshot.load(tmp_path / "c.snap").machine == ELSEWHERE


@pytest.mark.skipif(HERE is None, reason="this machine has no machine id")
def test_merged_captures_of_this_machine_keep_their_lines(tmp_path, app):
    from alloctrace._capture import merge_snapshots

    capture = tmp_path / "capture"
    capture.mkdir()
    snapshot_naming(capture, app, name="app-101.snap")
    snapshot_naming(capture, app, name="app-102.snap")
    written, err = shown(tmp_path, "stats", capture)
    assert APP_LINE in written, err
    one = made([(0, 10, ((str(app), 1),))])
    assert merge_snapshots([one, one]).machine == HERE
    assert merge_snapshots([one, made([(0, 10, ((str(app), 1),))], ELSEWHERE)]).machine is None


def test_large_source_files_are_read_only_to_a_bound(tmp_path):
    big = tmp_path / "big.py"
    with open(big, "wb") as stream:
        stream.truncate(8 << 30)  # sparse: 8 GiB of NULs that cost no disk
    path = snapshot_naming(tmp_path, big)
    result = cli(["stats", path])
    assert result.returncode == 0, result.stderr


# --- 2. the modes outputs are written with --------------------------------------------------------


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode_of(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def outputs(tmp_path):
    """Every writer of the API and the command line: name -> function(output path)."""
    snapshot = Snapshot([(0, 1000, (("a.py", 1),))], 1)
    snap = tmp_path / "source.snap"
    snapshot.dump(snap)

    def command(*args):
        def write(output):
            # clean_env() drops ALLOCTRACE_* variables: the one under test is passed on.
            mode = {k: v for k, v in os.environ.items() if k == "ALLOCTRACE_FILE_MODE"}
            result = cli([*args, output], **mode)
            assert result.returncode == 0, result.stderr

        return write

    return {
        "dump": snapshot.dump,
        "to_collapsed": snapshot.to_collapsed,
        "to_pprof": snapshot.to_pprof,
        "to_flamegraph": snapshot.to_flamegraph,
        "report": command("report", snap, "-o"),
        "export": command("export", snap, "--format", "folded", "-o"),
        "flamegraph": command("flamegraph", snap, "-o"),
    }


WRITERS = ["dump", "to_collapsed", "to_pprof", "to_flamegraph", "report", "export", "flamegraph"]


@pytest.mark.parametrize("writer", WRITERS)
def test_outputs_are_private_unless_asked_otherwise(tmp_path, umask_022, monkeypatch, writer):
    write = outputs(tmp_path)[writer]
    write(tmp_path / "new.out")
    assert mode_of(tmp_path / "new.out") == 0o600
    existing = tmp_path / "old.out"
    existing.write_text("old")
    existing.chmod(0o644)
    write(existing)
    assert mode_of(existing) == 0o600
    monkeypatch.setenv("ALLOCTRACE_FILE_MODE", "0644")
    write(tmp_path / "shared.out")
    assert mode_of(tmp_path / "shared.out") == 0o644


def test_exit_dumps_are_private(tmp_path, umask_022):
    from subproc import run_python

    dump = tmp_path / "exit.snap"
    result = run_python(["-c", "x = [1] * 1000"], ALLOCTRACE="1", ALLOCTRACE_DUMP=str(dump))
    assert result.returncode == 0, result.stderr
    assert mode_of(dump) == 0o600


def test_a_bad_file_mode_stops_start_up_with_a_dump(tmp_path):
    from subproc import run_python

    dump = tmp_path / "exit.snap"
    result = run_python(["-c", "pass"], ALLOCTRACE_DUMP=str(dump), ALLOCTRACE_FILE_MODE="644x")
    assert result.returncode == 2 and not dump.exists()
    assert len(result.stderr.splitlines()) == 1 and "ALLOCTRACE_FILE_MODE" in result.stderr


@pytest.mark.parametrize("value", ["rw", "0999", "1777", ""])
def test_a_bad_file_mode_is_refused_by_name(tmp_path, monkeypatch, value):
    monkeypatch.setenv("ALLOCTRACE_FILE_MODE", value)
    with pytest.raises(ValueError, match="ALLOCTRACE_FILE_MODE"):
        Snapshot([(0, 1000, (("a.py", 1),))], 1).dump(tmp_path / "x.snap")
    assert not (tmp_path / "x.snap").exists()


# --- 4. outputs that are devices or links to them -------------------------------------------------


@pytest.mark.parametrize("name", ["-", "link-to-stdout"])
def test_report_to_standard_output(tmp_path, name):
    snap = snapshot_naming(tmp_path, "a.py")
    if name != "-":
        (tmp_path / name).symlink_to("/proc/self/fd/1")
    result = cli(["report", snap, "-o", name], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("<!doctype html>") and "</html>" in result.stdout
    assert name == "-" or (tmp_path / name).is_symlink()
    assert not (tmp_path / "-").exists()


def test_export_to_standard_output(tmp_path):
    snap = snapshot_naming(tmp_path, "a.py")
    result = cli(["export", snap, "--format", "folded", "-o", "-"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "a.py:1 1000\n"
    assert not (tmp_path / "-").exists()


@pytest.fixture
def device_names(tmp_path):
    """A link to /dev/null and, where this user may make one, a null device node itself."""
    names = {"link": tmp_path / "null-link"}
    names["link"].symlink_to("/dev/null")
    try:
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        names["node"] = tmp_path / "null"
    except OSError:
        pass
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    names["fifo"] = fifo
    return names


@pytest.mark.parametrize("kind", ["link", "node", "fifo"])
def test_report_refuses_special_files_and_keeps_them(tmp_path, device_names, kind):
    if kind not in device_names:
        pytest.skip("mknod is not allowed here")
    target = device_names[kind]
    before = os.lstat(target)
    result = cli(["report", snapshot_naming(tmp_path, "a.py"), "-o", target])
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "not a regular file" in result.stderr and str(target) in result.stderr
    after = os.lstat(target)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)


@pytest.fixture
def pytest_run(tmp_path):
    """pytest on a one-test file, in a child with a time limit."""
    (tmp_path / "test_one.py").write_text("def test_it():\n    assert True\n")

    def run(*args):
        try:
            return subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                cwd=tmp_path,
                env=clean_env(),
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                preexec_fn=_limit_memory,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"pytest {' '.join(args)} ran for {TIMEOUT}s")

    return run


@pytest.mark.parametrize("kind", ["link", "node", "fifo"])
def test_pytest_baseline_refuses_special_files(tmp_path, device_names, pytest_run, kind):
    if kind not in device_names:
        pytest.skip("mknod is not allowed here")
    target = device_names[kind]
    before = os.lstat(target)
    result = pytest_run(f"--alloctrace-save-baseline={target}")
    assert result.returncode == 4, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "not a regular file" in errors[0], result.stderr
    after = os.lstat(target)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)


# --- 3. links planted at output names in a shared directory ---------------------------------------

NOBODY = 65534


@pytest.fixture
def planted(tmp_path):
    """A sticky shared directory holding, at the output name, a link owned by another user to a
    private file of ours: (link, victim)."""
    if os.geteuid() != 0:
        pytest.skip("planting another user's link needs root")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = tmp_path / "victim"
    victim.write_text("victim's data\n")
    victim.chmod(0o600)
    link = shared / "app-1.out"
    link.symlink_to(victim)
    os.lchown(link, NOBODY, NOBODY)
    return link, victim


@pytest.mark.parametrize("writer", WRITERS)
def test_a_planted_link_is_replaced_not_followed(tmp_path, planted, writer):
    link, victim = planted
    outputs(tmp_path)[writer](link)
    assert victim.read_text() == "victim's data\n" and mode_of(victim) == 0o600
    assert not link.is_symlink() and link.stat().st_size > 0


def test_a_planted_link_to_a_fifo_neither_blocks_nor_is_written_into(tmp_path, planted):
    link, _ = planted
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link.unlink()
    link.symlink_to(fifo)
    os.lchown(link, NOBODY, NOBODY)
    code = "import sys; from alloctrace import Snapshot; Snapshot([], 1).dump(sys.argv[1])"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(link)], capture_output=True, text=True, timeout=20
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the dump blocked on the FIFO the planted link leads to")
    assert done.returncode == 0, done.stderr
    assert not link.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_exit_dump_replaces_a_planted_link(tmp_path, planted):
    from subproc import run_python

    link, victim = planted
    result = run_python(["-c", "x = [1] * 1000"], ALLOCTRACE="1", ALLOCTRACE_DUMP=str(link))
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "victim's data\n"
    Snapshot.load(link)


def test_pytest_baseline_replaces_a_planted_link(tmp_path, planted, pytest_run):
    link, victim = planted
    result = pytest_run(f"--alloctrace-save-baseline={link}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert victim.read_text() == "victim's data\n"
    assert not link.is_symlink() and "alloctrace-pytest-baseline" in link.read_text()


def test_a_link_of_ours_is_still_followed(tmp_path):
    real = tmp_path / "real.html"
    real.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(real)
    result = cli(["report", snapshot_naming(tmp_path, "a.py"), "-o", link])
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and "<!doctype html>" in real.read_text()


# --- 11. the HTML report's smaller cases ----------------------------------------------------------


def test_report_of_a_frame_with_an_empty_file_name(tmp_path):
    from subproc import run_python

    # Traced live, so that the frame has a function name: "<module> (:1)" in the stacks.
    path = tmp_path / "empty-name.snap"
    code = "kept = [bytearray(1000) for _ in range(1000)]"
    program = f"exec(compile({code!r}, '', 'exec'))"
    done = run_python(["-c", program], ALLOCTRACE="5", ALLOCTRACE_DUMP=str(path))
    assert done.returncode == 0, done.stderr
    result = cli(["report", path, "-o", tmp_path / "r.html"])
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_a_title_holding_the_data_marker_stays_a_title(tmp_path):
    import html
    import re

    mark = "/*ALLOCTRACE_DATA*/null"
    title = f"before {mark} <!--ALLOCTRACE_TITLE--> after"
    out = tmp_path / "r.html"
    result = cli(["report", snapshot_naming(tmp_path, "a.py"), "-o", out, "--title", title])
    assert result.returncode == 0, result.stderr
    page = out.read_text()
    shown = re.search(r"<title>(.*?)</title>", page, re.S).group(1)
    assert html.unescape(shown) == title
    assert page.count('"version":') == 1  # the data document, embedded once


# --- 9. hostile pytest baseline files -------------------------------------------------------------


def baseline_with(peaks_text):
    return (
        '{"format": "alloctrace-pytest-baseline", "version": 1, '
        f'"peaks": {{"test_one.py::test_it": {peaks_text}}}}}'
    )


def hostile_baseline(tmp_path, case):
    path = tmp_path / "baseline.json"
    if case == "nested":
        path.write_text("[" * 200_000 + "]" * 200_000)
    elif case == "digits":
        path.write_text(baseline_with("9" * 5000))
    elif case == "huge":
        path.write_text(baseline_with(str(2**70)))
    elif case == "fifo":
        os.mkfifo(path)
    elif case == "zero":
        path = "/dev/zero"
    else:
        with open(path, "wb") as stream:
            stream.truncate(8 << 30)
    return path


BASELINES = [
    ("nested", "too deeply nested"),
    ("digits", "not a baseline file"),
    ("huge", "malformed peaks"),
    ("fifo", "not a regular file"),
    ("zero", "not a regular file"),
    ("large", "larger than"),
]


# In this process only what cannot block: a FIFO and /dev/zero are read by pytest in a child.
@pytest.mark.parametrize("case, message", [c for c in BASELINES if c[0] not in ("fifo", "zero")])
def test_hostile_baselines_are_refused_naming_the_file(tmp_path, case, message):
    from alloctrace._pytest_plugin import load_baseline

    path = hostile_baseline(tmp_path, case)
    with pytest.raises(pytest.UsageError) as info:
        load_baseline(str(path))
    assert message in str(info.value) and str(path) in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "case, message", [c for c in BASELINES if c[0] in ("fifo", "zero", "nested")]
)
def test_hostile_baselines_are_usage_errors(tmp_path, pytest_run, case, message):
    path = hostile_baseline(tmp_path, case)
    result = pytest_run(f"--alloctrace-baseline={path}")
    assert result.returncode == 4, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert message in errors[0] and str(path) in errors[0]


@pytest.mark.parametrize("tolerance", ["inf%", "1e400%", "-inf%", "nan%", "inf%+1KiB", "2e11%"])
def test_tolerances_that_are_not_numbers_are_refused(tolerance):
    from alloctrace._pytest_plugin import Tolerance

    with pytest.raises(ValueError, match="--alloctrace-tolerance"):
        Tolerance.parse(tolerance)


def test_an_infinite_tolerance_is_a_usage_error(pytest_run):
    result = pytest_run("--alloctrace", "--alloctrace-tolerance=inf%")
    assert result.returncode == 4, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "--alloctrace-tolerance" in errors[0], result.stderr
