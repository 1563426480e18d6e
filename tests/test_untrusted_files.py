"""Snapshots and reports that travel between machines and people (issue 61): what a crafted
snapshot may make the reader's machine read, the modes outputs are written with, symlinks and
special files at output names, hostile pytest baselines, and the HTML report's smaller cases.
Each case failed before its fix."""

import os
import resource
import signal
import subprocess
import sys

import pytest

from alloctrace._snapshot import Snapshot
from subproc import clean_env

pytestmark = pytest.mark.usefixtures("stopped_tracer")

#: What a hostile case may cost a command: it used to hang (a FIFO) or grow to gigabytes.
TIMEOUT = 30
MEMORY = 1 << 30


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def cli(args, cwd=None, **env):
    """``python -m alloctrace ARGS`` with a time and an address-space limit."""
    with subprocess.Popen(
        [sys.executable, "-m", "alloctrace", *map(str, args)],
        env=clean_env(**env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_limit_memory,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"alloctrace {' '.join(map(str, args))} ran for {TIMEOUT}s")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def snapshot_naming(tmp_path, *filenames, name="crafted.snap"):
    """A snapshot with one block allocated at line 1 of each of *filenames*."""
    traces = [(0, 1000 * (i + 1), ((str(f), 1),)) for i, f in enumerate(filenames)]
    path = tmp_path / name
    Snapshot(traces, 1).dump(path)
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
    Snapshot([(0, 1000 + line, ((str(named), line),)) for line in range(1, 101)], 1).dump(path)
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
    Snapshot([(0, 2000, ((str(source), 1),)), (0, 1000, ((str(script), 2),))], 1).dump(path)
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


def test_large_source_files_are_read_only_to_a_bound(tmp_path):
    big = tmp_path / "big.py"
    with open(big, "wb") as stream:
        stream.truncate(8 << 30)  # sparse: 8 GiB of NULs that cost no disk
    path = snapshot_naming(tmp_path, big)
    result = cli(["stats", path])
    assert result.returncode == 0, result.stderr
