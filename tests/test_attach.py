"""``alloctrace attach`` / ``detach`` on real running processes (through lldb), the failure
cases, and ``alloctrace snapshot PID`` on the processes attach and ``run --signal`` leave.

Each lldb run takes a second or more, so each test makes as few as it can. The targets answer
on stdin from a thread of their own, so that their main thread can be busy, asleep or inside a
long C call while the test talks to them."""

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import alloctrace
from alloctrace import _attach
from subproc import TIMEOUT, clean_env, run_python

needs_lldb = pytest.mark.skipif(
    shutil.which("lldb") is None,
    reason="lldb is not installed (apt-get install lldb; tests/run.sh installs it as root)",
)

# The main thread does what argv[1] says; a thread answers commands on stdin: "alloc"
# allocates on the marked line, "status" prints whether alloctrace and tracemalloc trace, the
# thread count and the open descriptors, anything else ends the process.
TARGET = textwrap.dedent(
    """\
    import os, select, sys, threading, time
    held = []

    def allocate():
        held.append([bytearray(2000) for _ in range(100)])  # the allocation line

    def answer():
        for line in sys.stdin:
            word = line.strip()
            if word == "alloc":
                allocate()
                print("ok", flush=True)
            elif word == "wake":
                gate.release()
                print("ok", flush=True)
            elif word == "status":
                traced = "alloctrace" in sys.modules and sys.modules["alloctrace"].is_tracing()
                import tracemalloc
                print(traced, tracemalloc.is_tracing(), threading.active_count(),
                      len(os.listdir("/proc/self/fd")), flush=True)
            else:
                break
        os._exit(0)

    def churn():
        while True:
            junk = [str(i) * 3 for i in range(200)]
            time.sleep(0.01)

    mode = sys.argv[1]
    gate = threading.Lock()
    gate.acquire()
    if mode == "busy":
        for _ in range(8):
            threading.Thread(target=churn, daemon=True).start()
    if mode == "tracemalloc":
        import tracemalloc
        tracemalloc.start()
    threading.Thread(target=answer).start()
    print("ready", flush=True)
    n = 0
    while True:
        if mode == "busy":
            n = sum(i * i for i in range(1000)) + n % 7
        elif mode == "ccall":
            select.select([], [], [], 2.0)  # a long C call with the GIL released
        elif mode == "blocked":
            gate.acquire()  # until "wake": blocked outside Python
            mode = "sleep"
        elif mode == "exit":
            # Ends after argv[2] seconds; its main thread never runs the queued code first.
            threading.Timer(float(sys.argv[2]), os._exit, (0,)).start()
            gate.acquire()
        else:
            time.sleep(0.05)
    """
)


class Target:
    def __init__(self, tmp_path, mode, *more, python=sys.executable, flags=()):
        self.script = tmp_path / "target.py"
        self.script.write_text(TARGET)
        self.proc = subprocess.Popen(
            [python, *flags, str(self.script), mode, *more],
            env=clean_env(),
            cwd=str(tmp_path),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "ready", self.proc.stderr.read()
        self.pid = self.proc.pid

    def ask(self, word):
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().split()

    def status(self):
        traced, tracemalloc, threads, fds = self.ask("status")
        return traced == "True", tracemalloc == "True", int(threads), int(fds)

    def debugger_leftovers(self):
        """What attach/detach sessions may leave mapped in the process: anonymous executable
        mappings (lldb runs expressions from such pages), and pages that start with the
        bootstrap lines (read through /proc/PID/mem: the test may trace its own child)."""
        executable, bootstraps = 0, 0
        prefix = _attach.BOOTSTRAP_PREFIX.encode()
        with open(f"/proc/{self.pid}/maps") as maps, open(f"/proc/{self.pid}/mem", "rb") as mem:
            for line in maps:
                fields = line.split()
                if len(fields) != 5:
                    continue
                executable += "x" in fields[1]
                if not fields[1].startswith("rw"):
                    continue
                low, high = (int(x, 16) for x in fields[0].split("-"))
                for page in range(low, high, 4096):
                    try:
                        mem.seek(page)
                        bootstraps += mem.read(len(prefix)) == prefix
                    except OSError:
                        pass
        return executable, bootstraps

    def alive(self):
        """The process answers (it is neither dead nor stopped)."""
        return self.proc.poll() is None and len(self.ask("status")) == 4

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()

    def line_size(self, path):
        lines = self.script.read_text().splitlines()
        line = next(i for i, text in enumerate(lines, 1) if "the allocation line" in text)
        return sum(
            stat.size
            for stat in alloctrace.Snapshot.load(path).statistics("lineno")
            if stat.traceback[0].filename == str(self.script) and stat.traceback[0].lineno == line
        )


@pytest.fixture
def target(tmp_path):
    made = []

    def make(*args, **kwargs):
        made.append(Target(tmp_path, *args, **kwargs))
        return made[-1]

    yield make
    for each in made:
        each.close()


def cli(*args, cwd=None):
    return run_python(["-m", "alloctrace", *map(str, args)], cwd=cwd)


@needs_lldb
def test_attach_snapshots_diff_detach_and_attach_again(target, tmp_path):
    """A process whose main thread is busy in a Python loop, with 8 more threads allocating.
    (benches/attach_soak.py attaches and detaches 20 times in a row.)"""
    proc = target("busy")
    base_threads, base_fds = proc.status()[2:]
    result = cli("attach", proc.pid, "-n", "5", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"tracing process {proc.pid} (Python " in result.stdout
    assert proc.status()[0]
    proc.ask("alloc")
    first = cli("snapshot", proc.pid)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == str(tmp_path / f"alloctrace-{proc.pid}-1.snap")
    proc.ask("alloc")
    second = cli("snapshot", proc.pid)
    assert second.returncode == 0, second.stderr
    first_path, second_path = first.stdout.strip(), second.stdout.strip()
    assert proc.line_size(first_path) >= 200_000
    assert proc.line_size(second_path) >= 2 * proc.line_size(first_path) * 0.95
    diff = cli("diff", first_path, second_path)
    assert diff.returncode == 0, diff.stderr
    assert re.search(r"#1: \S*target\.py:5: \+", diff.stdout), diff.stdout

    again = cli("attach", proc.pid)
    assert again.returncode == 1
    assert again.stderr.count("\n") == 1
    assert "already traced by 'alloctrace attach'" in again.stderr

    result = cli("detach", proc.pid)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"stopped tracing process {proc.pid}\n"
    traced, _, threads, fds = proc.status()
    assert not traced and threads == base_threads and fds == base_fds
    # lldb's pages and the bootstrap pages are given back: nothing new after the first round
    # (alloctrace itself keeps one executable page) and no bootstrap page at all.
    leftovers = proc.debugger_leftovers()
    assert leftovers[1] == 0
    gone = cli("snapshot", proc.pid, "--timeout", "1")
    assert gone.returncode == 1 and "not traced by 'alloctrace attach'" in gone.stderr

    result = cli("attach", proc.pid, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    snap = cli("snapshot", proc.pid)
    # The numbering goes on: the first attach's files are kept.
    assert snap.stdout.strip() == str(tmp_path / f"alloctrace-{proc.pid}-3.snap"), snap.stderr
    assert proc.line_size(first_path) >= 200_000
    assert cli("detach", proc.pid).returncode == 0
    assert proc.debugger_leftovers() == leftovers
    assert proc.alive()


@needs_lldb
def test_attach_to_a_process_in_a_long_c_call(target, tmp_path):
    """The main thread spends its time in 2 s C calls with the GIL released: tracing starts
    when one returns. Options reach the target (3 frames, native mode)."""
    proc = target("ccall")
    result = cli("attach", proc.pid, "-n", "3", "--native", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    proc.ask("alloc")
    snap = cli("snapshot", proc.pid)
    assert snap.returncode == 0, snap.stderr
    assert proc.line_size(snap.stdout.strip()) >= 200_000
    snapshot = alloctrace.Snapshot.load(snap.stdout.strip())
    assert snapshot.traceback_limit == 3
    assert proc.alive()


@needs_lldb
def test_attach_with_duration_writes_one_snapshot_and_stops(target, tmp_path):
    """A sleeping process: its main thread wakes every 50 ms."""
    proc = target("sleep")
    output = tmp_path / "short.snap"
    started = time.monotonic()
    result = cli("attach", proc.pid, "--duration", "1", "-o", output)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{output}\n"
    assert time.monotonic() - started >= 1
    snapshot = alloctrace.Snapshot.load(output)
    assert snapshot.metadata["pid"] == proc.pid
    assert proc.status()[0] is False
    assert proc.alive()


def _pid_of_no_process():
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid += 1
    return pid


@pytest.mark.parametrize(
    "case",
    ["missing", "not python", "zombie", "detach untraced"],
)
def test_failures_found_before_any_debugger(case, tmp_path):
    """Refused with one line, before lldb runs (so also where lldb is absent)."""
    if case == "missing":
        pid, expected = _pid_of_no_process(), "no process"
        proc = None
    elif case == "not python":
        proc = subprocess.Popen(["sleep", "30"])
        pid, expected = proc.pid, "(sleep) is not a CPython interpreter"
    elif case == "zombie":
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        while not open(f"/proc/{proc.pid}/stat").read().split(") ")[1].startswith("Z"):
            time.sleep(0.01)
        pid, expected = proc.pid, "has exited (it is a zombie)"
    else:
        proc = subprocess.Popen(["sleep", "30"])
        pid, expected = proc.pid, "is not a CPython interpreter"
    try:
        command = "detach" if case == "detach untraced" else "attach"
        result = cli(command, pid)
        assert result.returncode == 1
        assert result.stderr.count("\n") == 1, result.stderr
        assert expected in result.stderr
        if proc is not None and case != "zombie":
            assert proc.poll() is None
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


def test_refused_before_lldb_runs_in_process(target, monkeypatch):
    """Another user's process, and no lldb: refused before any debugger touches the target
    (checked in-process: a test cannot count on another user being able to run this venv)."""
    from alloctrace import _attach

    proc = target("sleep")
    with monkeypatch.context() as patch:
        patch.setattr(_attach.os, "geteuid", lambda: 54321)
        with pytest.raises(_attach.AttachError, match=r"belongs to another user \(root\)"):
            _attach.request(proc.pid, "start", {}, 1.0)
    with monkeypatch.context() as patch:
        patch.setattr(_attach.shutil, "which", lambda name: None)
        with pytest.raises(_attach.AttachError, match=r"no lldb .*apt-get install lldb"):
            _attach.request(proc.pid, "start", {}, 1.0)
    assert proc.alive() and proc.status()[0] is False


@pytest.mark.parametrize(
    "output, expected",
    [
        (
            "error: attach failed: Operation not permitted\n",
            r"not allowed to trace process \d+ \(attach failed: Operation not permitted\): .*"
            r"CAP_SYS_PTRACE.*ptrace_scope.*--cap-add=SYS_PTRACE",
        ),
        (
            "(lldb) expr -- ...\nerror: expression failed to parse: something\n",
            r"lldb could not queue the bootstrap in process \d+: expression failed to parse",
        ),
        (
            "Py_AddPendingCall)($alloctrace_run, $alloctrace_page)\n(int) $1 = -1\n",
            r"queue of pending calls is full",
        ),
    ],
)
def test_lldb_outputs_become_one_line(output, expected):
    from alloctrace import _attach

    class Live:
        pid = os.getpid()

    with pytest.raises(_attach.AttachError, match=expected) as info:
        _attach.Lldb._check(Live, output)
    assert "\n" not in str(info.value)


def _nobody_can_run_python():
    try:
        return (
            subprocess.run(
                [sys.executable, "-c", "import alloctrace"],
                preexec_fn=_as_nobody,
                capture_output=True,
                timeout=TIMEOUT,
                cwd="/",
            ).returncode
            == 0
        )
    except OSError:
        return False


def _as_nobody():
    os.setgid(65534)
    os.setuid(65534)


@needs_lldb
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the command as another user")
def test_ptrace_refused_names_the_permissions(tmp_path):
    """A process that is not dumpable may not be traced by a user without CAP_SYS_PTRACE, even
    its own, as under ptrace_scope 1 or in a container without CAP_SYS_PTRACE."""
    if not _nobody_can_run_python():
        pytest.skip("user nobody cannot run this interpreter with alloctrace (its directories)")
    code = (
        "import ctypes, os, sys, time; os.setgid(65534); os.setuid(65534); "
        "ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); print('ready', flush=True); time.sleep(30)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        result = subprocess.run(
            [sys.executable, "-m", "alloctrace", "attach", str(proc.pid)],
            env=clean_env(),
            capture_output=True,
            text=True,
            preexec_fn=_as_nobody,
            timeout=TIMEOUT,
            cwd="/",
        )
        assert result.returncode == 1
        assert result.stderr.count("\n") == 1, result.stderr
        assert "CAP_SYS_PTRACE" in result.stderr and "ptrace_scope" in result.stderr
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


@needs_lldb
@pytest.mark.parametrize("case", ["not importable", "tracemalloc", "blocked", "exits"])
def test_failures_in_the_target_leave_it_running(case, target, tmp_path):
    if case == "not importable":
        # -S: no site-packages, so no alloctrace on the target's sys.path.
        proc = target("sleep", flags=("-S",))
        result = cli("attach", proc.pid)
        assert "alloctrace cannot be imported in process" in result.stderr
        assert f"{sys.executable} -m pip install alloctrace" in result.stderr or (
            "-m pip install alloctrace" in result.stderr
        )
    elif case == "tracemalloc":
        proc = target("tracemalloc")
        result = cli("attach", proc.pid)
        assert "already traced by tracemalloc" in result.stderr
    elif case == "blocked":
        # The main thread waits on a lock: the attach gives up after 1 s, and the queued code
        # that runs once the lock is released must do nothing.
        proc = target("blocked")
        result = cli("attach", proc.pid, "--timeout", "1")
        assert "did not reach a point where Python code can run within 1 s" in result.stderr
        proc.ask("wake")
        time.sleep(0.5)
    else:
        proc = target("exit", "1.5")
        result = cli("attach", proc.pid)
        assert any(
            text in result.stderr for text in ("exited during the attach", "no process", "exited")
        ), result.stderr
        assert result.returncode == 1
        assert result.stderr.count("\n") == 1, result.stderr
        return
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert proc.alive()
    if case != "not importable":
        assert proc.status()[0] is False


def test_snapshot_of_run_forwards_to_its_program(tmp_path):
    """``run --signal``: the program takes snapshots on the signal, and ``snapshot`` given the
    pid of ``run`` itself asks the program."""
    script = tmp_path / "service.py"
    script.write_text(
        "import sys\nheld = [bytearray(1000) for _ in range(200)]\nprint('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    runner = subprocess.Popen(
        [sys.executable, "-m", "alloctrace", "run", "-q", "--signal", "SIGUSR2", "-o",
         str(tmp_path / "svc-{n}.snap"), str(script)],
        env=clean_env(),
        cwd=str(tmp_path),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert runner.stdout.readline().strip() == "ready"
        result = cli("snapshot", runner.pid)
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"{tmp_path / 'svc-1.snap'}\n"
        snapshot = alloctrace.Snapshot.load(tmp_path / "svc-1.snap")
        assert snapshot.metadata["pid"] != runner.pid
        # Sent to run by hand, the signal is passed on too, rather than ending run.
        os.kill(runner.pid, signal.SIGUSR2)
        deadline = time.monotonic() + TIMEOUT
        while not (tmp_path / "svc-2.snap").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "svc-2.snap").exists()
    finally:
        runner.stdin.close()
        runner.wait(timeout=TIMEOUT)
        runner.stdout.close()
        runner.stderr.close()
    assert runner.returncode == 0


def test_run_refuses_a_reserved_signal(tmp_path):
    result = cli("run", "--signal", "SIGTERM", "-c", "pass", cwd=tmp_path)
    assert result.returncode == 2
    assert "--signal 'SIGTERM' is invalid: SIGTERM is reserved" in result.stderr


def test_top_pid_asks_the_process_and_redraws_without_escapes_into_a_pipe(tmp_path):
    script = tmp_path / "service.py"
    script.write_text(
        "import time\nheld = []\nprint('ready', flush=True)\nwhile True:\n"
        "    held.append(bytearray(5000))  # grows\n    time.sleep(0.01)\n"
    )
    env = clean_env(ALLOCTRACE_SIGNAL="SIGUSR2", ALLOCTRACE_DUMP=str(tmp_path / "s-{n}.snap"))
    service = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True
    )
    top = None
    try:
        assert service.stdout.readline().strip() == "ready"
        top = subprocess.Popen(
            [sys.executable, "-m", "alloctrace", "top", "--pid", str(service.pid),
             "--interval", "0.3"],
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        output = ""
        while output.count("growth since") < 2:
            line = top.stdout.readline()
            assert line, top.stderr.read()
            output += line
        assert "\x1b" not in output
        assert "(the first dump: no growth yet)" in output
        assert re.search(r"service\.py:5: \+[\d.]+ KiB", output), output
        assert f"process {service.pid}, asked at" in output
        # It keeps the last two files it asked for.
        assert len(list(tmp_path.glob("s-*.snap"))) <= 3
    finally:
        if top is not None:
            top.kill()
            top.wait()
            top.stdout.close()
            top.stderr.close()
        service.kill()
        service.wait()
        service.stdout.close()


def test_top_pid_of_a_process_that_cannot_answer(tmp_path):
    proc = subprocess.Popen(["sleep", "30"])
    try:
        result = cli("top", "--pid", proc.pid, "--interval", "0.2", "x.snap")
        assert result.returncode == 2
        assert "give either FILE or --pid PID, not both" in result.stderr
    finally:
        proc.kill()
        proc.wait()
    result = cli("top", "--pid", _pid_of_no_process(), "--interval", "0.2")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "no process" in result.stderr
    # Not set up for snapshots: said once, not retried for ever.
    proc = subprocess.Popen(["sleep", "30"])
    try:
        result = cli("top", "--pid", proc.pid, "--interval", "0.2")
    finally:
        proc.kill()
        proc.wait()
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "was not started with ALLOCTRACE_SIGNAL" in result.stderr
