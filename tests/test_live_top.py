"""``alloctrace top --interval`` in a pseudo-terminal: it follows the newest dump of a series,
redraws with the growth since the dump before, and ends on Ctrl-C typed at the terminal."""

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import alloctrace
from subproc import TIMEOUT, clean_env, run_python


def dump(path, sizes):
    """A snapshot with one trace per (file, line, size); written as the process would."""
    traces = [(0, size, ((filename, line),)) for filename, line, size in sizes]
    alloctrace.Snapshot(traces, 1).dump(str(path))


class Terminal:
    """A child process on a pseudo-terminal of 100x30, its screen read as text."""

    def __init__(self, args, cwd):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        self.master = master
        self.proc = subprocess.Popen(
            [sys.executable, *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            env=clean_env(),
            start_new_session=True,
            # The terminal becomes the child's controlling terminal, so ^C typed there
            # interrupts it as it would a user's program.
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
        os.close(slave)
        self.output = ""

    def read_until(self, pattern, timeout=TIMEOUT):
        """Read until *pattern* appears after the last screen clear; return that screen."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.output.rsplit("\x1b[2J", 1)[-1]
            if re.search(pattern, screen):
                return screen
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{pattern!r} not on screen: {screen!r}")
            ready, _, _ = select.select([self.master], [], [], remaining)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"{pattern!r} never shown; output: {self.output!r}")
                self.output += chunk.decode("utf-8", "replace")

    def type(self, text):
        os.write(self.master, text.encode())

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=TIMEOUT)
        os.close(self.master)


def test_follows_the_newest_dump_and_ends_on_ctrl_c(tmp_path):
    term = Terminal(["-m", "alloctrace", "top", "--interval", "0.2", "app-*.snap"], tmp_path)
    try:
        term.read_until(r"waiting for a file matching app-\*\.snap")
        dump(tmp_path / "app-1.snap", [("app.py", 10, 4096), ("app.py", 20, 1000)])
        screen = term.read_until(r"Total: ")
        assert "Top 2 lines of app-1.snap (the first dump: no growth yet)" in screen
        assert "#1: app.py:10: 4.0 KiB" in screen
        time.sleep(0.05)  # a later modification time
        dump(tmp_path / "app-2.snap", [("app.py", 10, 4096), ("app.py", 20, 1000 + 300 * 1024)])
        screen = term.read_until(r"growth since app-1\.snap[\s\S]*Total: ")
        lines = screen.splitlines()
        assert lines[0].strip() == "Top 2 lines of app-2.snap, growth since app-1.snap"
        # Largest first, each with its growth.
        assert lines[1].startswith("#1: app.py:20: +300.0 KiB (+0 blocks), now 301.0 KiB")
        assert lines[2].startswith("#2: app.py:10: +0 B (+0 blocks), now 4.0 KiB")
        assert "2 dumps match app-*.snap" in screen
        term.type("\x03")  # Ctrl-C at the terminal
        assert term.proc.wait(timeout=TIMEOUT) == 0
    finally:
        term.close()


def test_unreadable_dump_is_reported_and_retried(tmp_path):
    (tmp_path / "app-1.snap").write_bytes(b"garbage")
    term = Terminal(["-m", "alloctrace", "top", "--interval", "0.2", "app-*.snap"], tmp_path)
    try:
        term.read_until(r"alloctrace top: .*app-1\.snap")
        dump(tmp_path / "app-1.snap", [("app.py", 10, 4096)])
        term.read_until(r"#1: app\.py:10: 4\.0 KiB")
        term.type("\x03")
        assert term.proc.wait(timeout=TIMEOUT) == 0
    finally:
        term.close()


def test_follows_every_process_of_a_capture(tmp_path):
    """On a capture directory: the newest snapshot of each process, summed per line."""
    import json

    capture = tmp_path / "cap"
    capture.mkdir()
    manifest = capture / "manifest.jsonl"

    def record(**fields):
        with open(manifest, "a") as file:
            file.write(json.dumps(fields) + "\n")

    record(event="start", id="1-1", pid=1, ppid=0, time=1.0, argv=["python", "app.py"])
    record(event="start", id="2-2", pid=2, ppid=1, time=2.0, argv=["python", "app.py"])
    dump(capture / "1-1.snap.1", [("app.py", 10, 4096)])
    record(event="snapshot", id="1-1", pid=1, time=3.0, file="1-1.snap.1", n=1)
    dump(capture / "2-2.snap.1", [("app.py", 10, 1024), ("app.py", 20, 100)])
    record(event="snapshot", id="2-2", pid=2, time=3.0, file="2-2.snap.1", n=1)
    term = Terminal(["-m", "alloctrace", "top", "--interval", "0.2", "cap"], tmp_path)
    try:
        screen = term.read_until(r"Ctrl-C to quit")
        assert "Top 2 lines summed over 2 processes of cap (the first look" in screen
        assert re.search(r"#1: app\.py:10: 5\.0 KiB in 2 blocks .*, in 2 processes", screen)
        assert re.search(r"#2: app\.py:20: 100 B in 1 block.*, in 1 process\r?$", screen, re.M)
        assert "2 processes in cap, 2 with a snapshot" in screen
        # The child writes a newer snapshot: its growth, summed with the parent's lines.
        dump(capture / "2-2.snap.2", [("app.py", 10, 1024), ("app.py", 20, 100 + 200 * 1024)])
        record(event="snapshot", id="2-2", pid=2, time=4.0, file="2-2.snap.2", n=2)
        screen = term.read_until(r"growth since the previous screen[\s\S]*Ctrl-C to quit")
        lines = screen.splitlines()
        assert lines[1].startswith("#1: app.py:20: +200.0 KiB (+0 blocks), now 200.1 KiB")
        assert lines[2].startswith("#2: app.py:10: +0 B (+0 blocks), now 5.0 KiB")
        term.type("\x03")
        assert term.proc.wait(timeout=TIMEOUT) == 0
    finally:
        term.close()


def test_bad_interval():
    result = run_python(["-m", "alloctrace", "top", "--interval", "soon", "x-*.snap"])
    assert result.returncode == 2
    assert result.stderr == (
        "alloctrace: error: argument --interval: expected a number of seconds greater than 0, "
        "not 'soon'\n"
    )


def test_limit_and_full_paths(tmp_path):
    source = str(tmp_path / "app.py")
    dump(tmp_path / "app-1.snap", [(source, 1, 100), (source, 2, 200)])
    args = ["-m", "alloctrace", "top", "--interval", "0.2", "app-*.snap"]
    for extra, expected in (
        ([], "#1: app.py:2: 200 B"),
        # (the terminal is 100 columns wide, so a long path is cut at its start)
        (["--full-paths", "--limit", "1"], "/app.py:2: 200 B"),
    ):
        term = Terminal([*args, *extra], tmp_path)
        try:
            screen = term.read_until(r"Total: ")
            assert expected in screen
            assert ("#1: app.py:2" in screen) == (not extra)
            assert ("#2: " in screen) == (not extra)
            term.type("\x03")
            assert term.proc.wait(timeout=TIMEOUT) == 0
        finally:
            term.close()
