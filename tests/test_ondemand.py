"""Snapshots on demand: ``ALLOCTRACE_SIGNAL`` in a real process, and ``alloctrace snapshot PID``
(alloctrace._ondemand) asking for them."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import alloctrace
from alloctrace import _ondemand
from subproc import TIMEOUT, clean_env, run_python

# Allocates on a known line, says "ready", then waits for lines on stdin: "more" allocates
# again, "own" installs the program's own handler for SIGUSR2, anything else ends.
SERVICE = textwrap.dedent(
    """\
    import signal, sys
    held = []

    def allocate():
        held.append([bytearray(2000) for _ in range(50)])  # the allocation line

    allocate()
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "more":
            allocate()
        elif line.strip() == "own":
            signal.signal(signal.SIGUSR2, lambda *a: print("own handler", flush=True))
        else:
            break
        print("ok", flush=True)
    """
)


def start(tmp_path, preexec_fn=None, **env):
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        env=clean_env(**env),
        cwd=str(tmp_path),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec_fn,
    )
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    return proc, script


def finish(proc):
    """Close the service's stdin (it ends) and return its stderr."""
    proc.stdin.close()
    proc.stdout.read()
    err = proc.stderr.read()
    proc.wait(timeout=TIMEOUT)
    return err


def tell(proc, line):
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "ok"


def allocation_line(script):
    lines = script.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if "the allocation line" in line)


def line_size(path, script):
    snapshot = alloctrace.Snapshot.load(path)
    line = allocation_line(script)
    return sum(
        stat.size
        for stat in snapshot.statistics("lineno")
        if stat.traceback[0].filename == str(script) and stat.traceback[0].lineno == line
    )


def test_snapshots_on_signal_from_a_running_process(tmp_path):
    proc, script = start(
        tmp_path, ALLOCTRACE_SIGNAL="SIGUSR2", ALLOCTRACE_DUMP="app-{pid}-{n}.snap"
    )
    try:
        first = _ondemand.request_snapshot(proc.pid, timeout=TIMEOUT)
        assert first == str(tmp_path / f"app-{proc.pid}-1.snap")
        tell(proc, "more")
        second = _ondemand.request_snapshot(proc.pid, timeout=TIMEOUT)
        assert second == str(tmp_path / f"app-{proc.pid}-2.snap")
        # Each is a snapshot of that moment: the line doubled in between.
        assert line_size(first, script) >= 100_000
        assert line_size(second, script) >= 2 * line_size(first, script) * 0.95
        assert alloctrace.Snapshot.load(second).metadata["pid"] == proc.pid
    finally:
        err = finish(proc)
    assert proc.returncode == 0, err
    assert err == ""
    # The exit snapshot continues the numbering.
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["service.py", f"app-{proc.pid}-1.snap", f"app-{proc.pid}-2.snap", f"app-{proc.pid}-3.snap"]
    )


def test_relative_dump_path_is_the_targets_not_the_clis(tmp_path):
    """A relative ALLOCTRACE_DUMP names a file in the target's directory: the CLI, run from
    another one, waits there (/proc/PID/cwd), not in its own."""
    service, elsewhere = tmp_path / "service", tmp_path / "elsewhere"
    service.mkdir()
    elsewhere.mkdir()
    proc, _ = start(service, ALLOCTRACE_SIGNAL="SIGUSR2", ALLOCTRACE_DUMP="app-{n}.snap")
    try:
        args = ["-m", "alloctrace", "snapshot", "--timeout", str(TIMEOUT), str(proc.pid)]
        result = run_python(args, cwd=str(elsewhere))
    finally:
        finish(proc)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{service / 'app-1.snap'}\n"
    assert os.listdir(elsewhere) == []
    assert alloctrace.Snapshot.load(service / "app-1.snap").metadata["pid"] == proc.pid


def test_template_without_n_gets_numbered_files(tmp_path):
    proc, _ = start(tmp_path, ALLOCTRACE_SIGNAL="usr1", ALLOCTRACE_DUMP="app.snap")
    try:
        path = _ondemand.request_snapshot(proc.pid, timeout=TIMEOUT)
    finally:
        finish(proc)
    assert path == str(tmp_path / "app.1.snap")


def test_signal_ignored_at_start_is_left_alone(tmp_path):
    def ignore():
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)

    proc, _ = start(
        tmp_path, preexec_fn=ignore, ALLOCTRACE_SIGNAL="SIGUSR2", ALLOCTRACE_DUMP="app.snap"
    )
    try:
        with pytest.raises(_ondemand.RequestError) as info:
            _ondemand.request_snapshot(proc.pid, timeout=0.5)
        assert str(info.value) == f"process {proc.pid} ignores SIGUSR2: not signalled"
        tell(proc, "more")  # still alive
    finally:
        err = finish(proc)
    assert err.splitlines()[0] == (
        "alloctrace: ALLOCTRACE_SIGNAL=SIGUSR2: the signal is already ignored here; "
        "no snapshots on it"
    )
    assert proc.returncode == 0


def test_a_handler_the_program_installs_wins(tmp_path):
    proc, _ = start(tmp_path, ALLOCTRACE_SIGNAL="SIGUSR2", ALLOCTRACE_DUMP="app.snap")
    try:
        tell(proc, "own")
        with pytest.raises(_ondemand.RequestError, match="wrote no snapshot matching"):
            _ondemand.request_snapshot(proc.pid, timeout=0.5)
        assert proc.stdout.readline().strip() == "own handler"
    finally:
        finish(proc)
    assert sorted(os.listdir(tmp_path)) == ["app.snap", "service.py"]


def test_process_without_the_setting(tmp_path):
    proc, _ = start(tmp_path, ALLOCTRACE_DUMP="app.snap")
    try:
        with pytest.raises(_ondemand.RequestError) as info:
            _ondemand.request_snapshot(proc.pid, timeout=0.5)
    finally:
        finish(proc)
    assert str(info.value) == (
        f"process {proc.pid} was not started with ALLOCTRACE_SIGNAL and is not traced by "
        "'alloctrace attach': start it with ALLOCTRACE_SIGNAL=SIGUSR2 ALLOCTRACE_DUMP=PATH or "
        "'alloctrace run --signal SIGUSR2', or attach to it first"
    )


def test_no_such_process():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(_ondemand.RequestError, match=f"^no process {proc.pid}$"):
        _ondemand.request_snapshot(proc.pid, timeout=0.5)


@pytest.mark.parametrize(
    "env, needle",
    [
        (
            {"ALLOCTRACE_DUMP": "x.snap", "ALLOCTRACE_SIGNAL": "SIGNOPE"},
            "ALLOCTRACE_SIGNAL='SIGNOPE' is invalid: not a signal name",
        ),
        (
            {"ALLOCTRACE_DUMP": "x.snap", "ALLOCTRACE_SIGNAL": "SIGTERM"},
            "ALLOCTRACE_SIGNAL='SIGTERM' is invalid: SIGTERM is reserved",
        ),
        (
            {"ALLOCTRACE_DUMP": "x.snap", "ALLOCTRACE_SIGNAL": "int"},
            "ALLOCTRACE_SIGNAL='int' is invalid: SIGINT is reserved",
        ),
        (
            {"ALLOCTRACE_DUMP": "x.snap", "ALLOCTRACE_SIGNAL": "SIGKILL"},
            "SIGKILL is reserved",
        ),
        ({"ALLOCTRACE_DUMP": "x.snap", "ALLOCTRACE_SIGNAL": "12; rm"}, "not a signal name"),
        ({"ALLOCTRACE_SIGNAL": "SIGUSR2"}, "ALLOCTRACE_SIGNAL is set but ALLOCTRACE_DUMP is not"),
    ],
)
def test_bad_signal_settings_stop_before_the_program(tmp_path, env, needle):
    result = run_python(["-c", "print('program ran')"], cwd=str(tmp_path), **env)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("alloctrace: ") and needle in lines[0], lines
    assert os.listdir(tmp_path) == []


def test_snapshot_command(tmp_path):
    proc, script = start(tmp_path, ALLOCTRACE_SIGNAL="SIGUSR2", ALLOCTRACE_DUMP="app-{n}.snap")
    try:
        result = run_python(["-m", "alloctrace", "snapshot", str(proc.pid)])
        assert result.returncode == 0, result.stderr
        assert result.stdout == str(tmp_path / "app-1.snap") + "\n"
        assert line_size(result.stdout.strip(), script) >= 100_000
        tell(proc, "own")
        result = run_python(["-m", "alloctrace", "snapshot", "--timeout", "0.5", str(proc.pid)])
        assert result.returncode == 1
        assert result.stderr.startswith(
            f"alloctrace: error: process {proc.pid} wrote no snapshot matching "
        )
        assert len(result.stderr.splitlines()) == 1
    finally:
        finish(proc)


# Issue 61 item 5: processes that carry the variables without tracing are not signalled (the
# default action would kill them), a flood of requests is coalesced and bounded, and a
# request during finalization changes nothing.
@pytest.mark.parametrize(
    "args, extra",
    [
        (["sleep", "30"], {}),
        ([sys.executable, "-E", "-c", "import time; time.sleep(30)"], {}),
        ([sys.executable, "-c", "import time; time.sleep(30)"], {"ALLOCTRACE": "0"}),
    ],
    ids=["sleep", "python -E", "ALLOCTRACE=0"],
)
def test_processes_that_do_not_trace_are_not_signalled(tmp_path, args, extra):
    env = clean_env(ALLOCTRACE_SIGNAL="SIGUSR2", ALLOCTRACE_DUMP="app.snap", **extra)
    proc = subprocess.Popen(args, env=env, cwd=str(tmp_path))
    try:
        # Wait until it runs (python -E reads no site-packages .pth, but still starts up).
        time.sleep(0.5)
        with pytest.raises(_ondemand.RequestError) as info:
            _ondemand.request_snapshot(proc.pid, timeout=5)
        assert str(info.value).startswith(
            f"process {proc.pid} has no handler for SIGUSR2, so it would die of it: not signalled"
        )
        time.sleep(0.2)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    assert os.listdir(tmp_path) == []


def _thread_states(pid):
    """Each thread's name, state, kernel wait channel and signal masks (from /proc)."""
    states = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        task = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{task}/status") as status:
                fields = dict(line.split(":\t", 1) for line in status if ":\t" in line)
            with open(f"{task}/wchan") as wchan:
                channel = wchan.read()
        except OSError:
            continue
        keep = ("Name", "State", "SigPnd", "ShdPnd", "SigBlk", "SigCgt")
        states.append({"tid": tid, "wchan": channel, **{k: fields[k].strip() for k in keep}})
    return states


def test_a_flood_of_requests_is_coalesced_and_bounded(tmp_path):
    proc, _ = start(tmp_path, ALLOCTRACE_SIGNAL="SIGUSR2", ALLOCTRACE_DUMP="app-{n}.snap")
    try:
        began = time.monotonic()
        # A paced flood for a second and a half: the kernel merges only signals that arrive
        # while one is pending, so most of these reach the handler.
        while time.monotonic() - began < 1.5:
            os.kill(proc.pid, signal.SIGUSR2)
            time.sleep(0.0005)
        # Every request made before this one is served by a snapshot started after it.
        last = _ondemand.request_snapshot(proc.pid, timeout=TIMEOUT)
        tell(proc, "more")  # alive and responsive
        # Paced requests, each answered by a snapshot of its own.
        paths = []
        for _ in range(5):
            try:
                paths.append(_ondemand.request_snapshot(proc.pid, timeout=TIMEOUT))
            except _ondemand.RequestError as exc:
                # Seen twice in CI (3.9, 3.12), not reproduced here: say what the process was
                # doing, for the next time.
                state = _thread_states(proc.pid)
                files = sorted(os.listdir(tmp_path))
                raise AssertionError(
                    f"{exc}\nthreads: {state}\nfiles: {files}\nstderr: {finish(proc)!r}"
                ) from None
        assert len(set(paths)) == 5 and last not in paths
    finally:
        err = finish(proc)
    elapsed = time.monotonic() - began
    assert proc.returncode == 0 and err == "", err
    written = [name for name in os.listdir(tmp_path) if name.endswith(".snap")]
    # At most ten on-demand snapshots a second, and the exit snapshot.
    assert 7 <= len(written) <= elapsed * 10 + 2, (len(written), elapsed)


def test_a_request_during_finalization_changes_nothing(tmp_path):
    # The program ends while another process signals it without pause: neither the exit
    # snapshot nor the exit status may change.
    script = tmp_path / "ends.py"
    script.write_text(
        "import os, subprocess, time\n"
        "sender = subprocess.Popen(['sh', '-c', "
        "f'while kill -USR2 {os.getpid()} 2>/dev/null; do :; done'],\n"
        # Not our output pipes: the sender outlives us until our parent reaps us.
        "    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "time.sleep(0.3)\n"
        "print('done', flush=True)\n"
    )
    for attempt in range(3):
        result = run_python(
            [str(script)],
            cwd=str(tmp_path),
            ALLOCTRACE_SIGNAL="SIGUSR2",
            ALLOCTRACE_DUMP=f"run{attempt}-{{n}}.snap",
        )
        assert (result.returncode, result.stdout, result.stderr) == (0, "done\n", "")
        numbers = sorted(
            int(name[len(f"run{attempt}-") : -5])
            for name in os.listdir(tmp_path)
            if name.startswith(f"run{attempt}-")
        )
        # The exit snapshot is the last of the numbered series.
        assert numbers == list(range(1, len(numbers) + 1)) and numbers
        alloctrace.Snapshot.load(tmp_path / f"run{attempt}-{numbers[-1]}.snap")


def test_changing_a_handler_under_a_stream_of_signals_prints_nothing(tmp_path):
    # What the exit snapshot does to the snapshot signal (and detach, and run to its own
    # handlers), many times over while another process signals without pause: with
    # signal.signal alone, CPython 3.10 printed "OSError: Signal 12 ignored due to race
    # condition" a dozen times in 3 s of this (seen in CI once, in the test above).
    script = tmp_path / "toggles.py"
    script.write_text(
        "import os, signal, subprocess, time\n"
        "from alloctrace._signals import set_handler\n"
        "def handler(signum, frame): pass\n"
        # The handler first: the sender's first signal would otherwise end us.
        "signal.signal(signal.SIGUSR2, handler)\n"
        "sender = subprocess.Popen(['sh', '-c', "
        "f'while kill -USR2 {os.getpid()} 2>/dev/null; do :; done'],\n"
        "    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "end = time.monotonic() + 2\n"
        "while time.monotonic() < end:\n"
        "    set_handler(signal.SIGUSR2, signal.SIG_IGN)\n"
        "    set_handler(signal.SIGUSR2, handler)\n"
        # Ignored before the sender goes: a signal still on its way cannot end us.
        "set_handler(signal.SIGUSR2, signal.SIG_IGN)\n"
        "sender.kill()\n"
        "sender.wait()\n"
        "print('done', flush=True)\n"
    )
    result = run_python([str(script)], cwd=str(tmp_path))
    assert (result.returncode, result.stdout, result.stderr) == (0, "done\n", "")


def test_set_handler_refuses_what_signal_refuses():
    from alloctrace._signals import set_handler

    with pytest.raises((OSError, ValueError), match="signal 9"):
        set_handler(signal.SIGKILL, signal.SIG_DFL)


def test_a_storm_of_requests_does_not_nest_the_handler(tmp_path):
    # With a thread asking for the GIL, CPython ran the storm's next handler inside the running
    # one each time it took the GIL back, one level deeper each time, until RecursionError
    # (seen in CI as "cannot write snapshot ...: maximum recursion depth exceeded" at exit).
    # A low recursion limit makes it quick.
    script = tmp_path / "storm.py"
    script.write_text(
        "import os, subprocess, sys, threading, time\n"
        "sys.setrecursionlimit(60)\n"
        "def spin():\n"
        "    while True:\n"
        "        sum(range(1000))\n"
        "threading.Thread(target=spin, daemon=True).start()\n"
        "sender = subprocess.Popen(['sh', '-c', "
        "f'while kill -USR2 {os.getpid()} 2>/dev/null; do :; done'],\n"
        "    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "end = time.monotonic() + 3\n"
        "while time.monotonic() < end:\n"
        "    sum(range(100))\n"
        "sender.kill()\n"
        "sender.wait()\n"
        "print('done', flush=True)\n"
    )
    result = run_python(
        [str(script)], cwd=str(tmp_path), ALLOCTRACE_SIGNAL="SIGUSR2", ALLOCTRACE_DUMP="s-{n}.snap"
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "done\n", "")


def _blocked_signals(pid, tid):
    with open(f"/proc/{pid}/task/{tid}/status") as status:
        mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigBlk:"))
    return {signum for signum in signal.valid_signals() if mask >> (signum - 1) & 1}


def test_signals_for_the_process_reach_the_programs_threads_only(tmp_path):
    # The kernel may give a signal for the process to any thread that does not block it, and
    # CPython runs the handler in the main thread only: one taken by a thread of ours while
    # the main thread waited on stdin went unanswered (a request in CI waited 120 s). Every
    # thread alloctrace starts blocks the signals, except those a fault of its own raises.
    proc, _ = start(
        tmp_path,
        ALLOCTRACE_SIGNAL="SIGUSR2",
        ALLOCTRACE_DUMP="app-{n}.snap",
        ALLOCTRACE_INTERVAL="3600",
        ALLOCTRACE_MEMORY_LIMIT="1G",
        ALLOCTRACE_PUSH="http://127.0.0.1:9",
        ALLOCTRACE_PUSH_INTERVAL="3600",
    )
    try:
        tids = sorted(int(tid) for tid in os.listdir(f"/proc/{proc.pid}/task"))
        # on demand, interval dumps, memory limit, push
        assert len(tids) >= 5, tids
        assert signal.SIGUSR2 not in _blocked_signals(proc.pid, proc.pid)
        for tid in tids:
            if tid != proc.pid:
                blocked = _blocked_signals(proc.pid, tid)
                wanted = {signal.SIGUSR2, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD}
                assert wanted <= blocked, (tid, blocked)
                assert not blocked & {signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT}, tid
        # And the main thread still answers (pushing samples: the line may not be in it).
        path = _ondemand.request_snapshot(proc.pid, timeout=TIMEOUT)
        assert alloctrace.Snapshot.load(path).sample_interval > 0
    finally:
        finish(proc)


def test_a_request_is_answered_while_the_main_thread_waits_in_native_code(tmp_path):
    # The Python handler runs only when the main thread next checks: here it waits for ever
    # in pthread_mutex_lock (the GIL released, as ctypes does), which goes back to waiting
    # after a signal. The request is counted in C and answered by the snapshot thread.
    script = tmp_path / "stuck.py"
    script.write_text(
        textwrap.dedent(
            """\
            import ctypes
            held = [bytearray(2000) for _ in range(50)]  # the allocation line
            libc = ctypes.CDLL(None)
            mutex = ctypes.create_string_buffer(64)  # PTHREAD_MUTEX_INITIALIZER: zeroes
            libc.pthread_mutex_lock(mutex)
            print("ready", flush=True)
            libc.pthread_mutex_lock(mutex)  # never returns
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        env=clean_env(ALLOCTRACE_SIGNAL="SIGUSR2", ALLOCTRACE_DUMP="stuck-{n}.snap"),
        cwd=str(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        time.sleep(0.2)  # in the second lock by now
        path = _ondemand.request_snapshot(proc.pid, timeout=TIMEOUT)
        assert line_size(path, script) >= 100_000
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
