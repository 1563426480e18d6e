"""The child-process helper every start-up, CLI and fork test goes through: a timeout must
take the child's own children with it (a fork test whose forked child hangs would otherwise
leave it running, and waiting for locks, for the rest of the test run)."""

import subprocess
import time

import pytest

import subproc


def running(pid):
    """Whether *pid* exists and is not a zombie (an orphan waits for whoever reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_timeout_kills_the_grandchildren_too(monkeypatch, tmp_path):
    monkeypatch.setattr(subproc, "TIMEOUT", 2)
    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    open(sys.argv[1], 'w').write(str(os.getpid()))\n"
        "    time.sleep(60)\n"
        "time.sleep(60)\n"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        subproc.run_python(["-c", script, str(pid_file)])
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not running(grandchild):
            return
        time.sleep(0.05)
    pytest.fail(f"grandchild {grandchild} still running after the timeout")


def test_output_and_status_come_back():
    result = subproc.run_python(["-c", "import sys; print('out'); sys.exit(3)"], X_TEST="1")
    assert (result.returncode, result.stdout) == (3, "out\n")
