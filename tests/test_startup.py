"""Start-up tracing through the installed ``alloctrace_startup.pth``: ``ALLOCTRACE``,
``-X alloctrace``, ``ALLOCTRACE_DUMP`` at every kind of exit, ``{pid}`` in multi-process
programs and ``ALLOCTRACE_INTERVAL``. Every case runs a fresh interpreter, bounded in time."""

import os
import signal
import subprocess
import sys
import sysconfig
import textwrap

import pytest

import alloctrace
from subproc import clean_env
from subproc import run_python as run

TIMEOUT = 60

# Prints whether tracing is on and the traceback limit, as seen by the program's first lines.
PROBE = (
    "import alloctrace\n"
    "print(alloctrace.is_tracing(), alloctrace.is_tracing() and "
    "alloctrace.take_snapshot().traceback_limit)\n"
)


def write(tmp_path, name, source):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def test_pth_file_is_at_top_of_site_packages():
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    found = [d for d in dirs if os.path.isfile(os.path.join(d, "alloctrace_startup.pth"))]
    assert found, f"alloctrace_startup.pth not found in {sorted(dirs)}"
    with open(os.path.join(found[0], "alloctrace_startup.pth")) as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("import ")
    # Every start-up variable must wake the hook on its own (ALLOCTRACE_NATIVE=1 alone once
    # did nothing): _startup.read_config then decides.
    from alloctrace import _startup

    names = [v for k, v in vars(_startup).items() if k.startswith("ENV_")]
    assert len(names) >= 10
    missing = [n for n in names if f'"{n}"' not in lines[0]]
    assert not missing, missing


def test_not_imported_when_unset():
    result = run(["-c", "import sys; print('alloctrace' in sys.modules)"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    assert result.stderr == ""


@pytest.mark.parametrize(
    "args, env, expected",
    [
        ([], {}, "False False"),
        ([], {"ALLOCTRACE": "1"}, "True 1"),
        ([], {"ALLOCTRACE": "5"}, "True 5"),
        ([], {"ALLOCTRACE": " 7 "}, "True 7"),
        ([], {"ALLOCTRACE": "65535"}, "True 65535"),
        ([], {"ALLOCTRACE": "0"}, "False False"),
        ([], {"ALLOCTRACE": ""}, "False False"),
        (["-X", "alloctrace"], {}, "True 1"),
        (["-X", "alloctrace=3"], {}, "True 3"),
        (["-X", "alloctrace=0"], {}, "False False"),
        # The option wins over the variable, as -X tracemalloc over PYTHONTRACEMALLOC.
        (["-X", "alloctrace=2"], {"ALLOCTRACE": "9"}, "True 2"),
        (["-X", "alloctrace=0"], {"ALLOCTRACE": "9"}, "False False"),
        # -E and -I ignore the variables but not the option.
        (["-E"], {"ALLOCTRACE": "4"}, "False False"),
        (["-I"], {"ALLOCTRACE": "4"}, "False False"),
        (["-E", "-X", "alloctrace=4"], {}, "True 4"),
        (["-I", "-X", "alloctrace=4"], {"ALLOCTRACE": "abc"}, "True 4"),
        # ALLOCTRACE_DUMP alone implies one frame; ALLOCTRACE=0 turns everything off.
        ([], {"ALLOCTRACE_DUMP": "probe.snap"}, "True 1"),
        ([], {"ALLOCTRACE_DUMP": "probe.snap", "ALLOCTRACE": "0"}, "False False"),
    ],
)
def test_start_forms(tmp_path, args, env, expected):
    result = run([*args, "-c", PROBE], cwd=tmp_path, **env)
    assert result.stdout.strip() == expected, result.stderr
    assert result.returncode == 0
    assert result.stderr == ""
    written = os.listdir(tmp_path)
    dumped = expected.startswith("True") and "ALLOCTRACE_DUMP" in env
    assert written == (["probe.snap"] if dumped else []), written


@pytest.mark.parametrize(
    "args, env, names",
    [
        ([], {"ALLOCTRACE": "abc"}, "ALLOCTRACE='abc'"),
        ([], {"ALLOCTRACE": "-1"}, "ALLOCTRACE='-1'"),
        ([], {"ALLOCTRACE": "65536"}, "ALLOCTRACE='65536'"),
        ([], {"ALLOCTRACE": "1.5"}, "ALLOCTRACE='1.5'"),
        (["-X", "alloctrace=abc"], {}, "-X alloctrace=abc"),
        (["-X", "alloctrace="], {}, "-X alloctrace="),
        (["-X", "alloctrace=99999"], {"ALLOCTRACE": "1"}, "-X alloctrace=99999"),
    ],
)
def test_invalid_nframe_stops_before_the_program(args, env, names):
    result = run([*args, "-c", "print('program ran')"], **env)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert names in lines[0]
    assert "0 to 65535" in lines[0]


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"ALLOCTRACE_DUMP": "x.snap", "ALLOCTRACE_INTERVAL": "soon"}, "ALLOCTRACE_INTERVAL"),
        ({"ALLOCTRACE_DUMP": "x.snap", "ALLOCTRACE_INTERVAL": "0"}, "at least 0.1"),
        ({"ALLOCTRACE_DUMP": "x.snap", "ALLOCTRACE_INTERVAL": "-3"}, "at least 0.1"),
        ({"ALLOCTRACE_INTERVAL": "1"}, "ALLOCTRACE_DUMP is not"),
        ({"ALLOCTRACE_DUMP": "x-{host}.snap"}, "unknown placeholder {host}"),
        ({"ALLOCTRACE_DUMP": "x-{pid.snap"}, "ALLOCTRACE_DUMP"),
        ({"ALLOCTRACE_DUMP": "x.snap", "ALLOCTRACE_OBJECTS": "yes"}, "ALLOCTRACE_OBJECTS='yes'"),
        ({"ALLOCTRACE_DUMP": "x.snap", "ALLOCTRACE_OBJECTS": "2"}, "expected 1 (on) or 0"),
        ({"ALLOCTRACE_OBJECTS": "1"}, "ALLOCTRACE_DUMP is not"),
    ],
)
def test_invalid_dump_settings_stop_before_the_program(tmp_path, env, needle):
    result = run(["-c", "print('program ran')"], cwd=tmp_path, **env)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert os.listdir(tmp_path) == []


def test_tracing_starts_before_the_first_line(tmp_path):
    script = write(
        tmp_path,
        "first.py",
        """\
        data = [bytearray(4096) for _ in range(64)]
        import alloctrace
        stats = alloctrace.take_snapshot().statistics("lineno")
        print(any(s.traceback[0].filename == __file__ and s.traceback[0].lineno == 1
                  and s.size >= 64 * 4096 for s in stats))
        """,
    )
    result = run([script], ALLOCTRACE="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


LEAKER = """\
import os, signal, sys, time
kept = [bytearray(2048) for _ in range(200)]
mode = sys.argv[1]
if mode == "exit":
    sys.exit(5)
if mode == "raise":
    raise RuntimeError("deliberate")
if mode == "own-handler":
    def handler(signum, frame):
        print("own handler", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, handler)
if mode in ("sigterm", "own-handler"):
    print("ready", flush=True)
    time.sleep(TIMEOUT)
"""


def leaker(tmp_path):
    return write(tmp_path, "leaker.py", LEAKER.replace("TIMEOUT", str(TIMEOUT)))


def assert_leak_in(path, script):
    snapshot = alloctrace.Snapshot.load(path)
    sizes = {
        (s.traceback[0].filename, s.traceback[0].lineno): s.size
        for s in snapshot.statistics("lineno")
    }
    assert sizes.get((script, 2), 0) >= 200 * 2048, sorted(sizes.items())[:5]
    return snapshot


@pytest.mark.parametrize(
    "mode, status",
    [("end", 0), ("exit", 5), ("raise", 1)],
)
def test_dump_at_exit(tmp_path, mode, status):
    script = leaker(tmp_path)
    dump = tmp_path / "out.snap"
    result = run([script, mode], ALLOCTRACE_DUMP=str(dump))
    assert result.returncode == status, result.stderr
    if mode == "raise":
        assert "RuntimeError: deliberate" in result.stderr
    else:
        assert result.stderr == ""
    snapshot = assert_leak_in(str(dump), script)
    assert snapshot.traceback_limit == 1
    assert snapshot.metadata["pid"] > 0
    assert snapshot.metadata["argv"][-1] == mode


def start_and_wait_ready(args, **env):
    proc = subprocess.Popen(
        [sys.executable, *args],
        env=clean_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_dump_on_sigterm_keeps_the_signal_status(tmp_path):
    script = leaker(tmp_path)
    dump = tmp_path / "term.snap"
    proc = start_and_wait_ready([script, "sigterm"], ALLOCTRACE="4", ALLOCTRACE_DUMP=str(dump))
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == -signal.SIGTERM, err
    snapshot = assert_leak_in(str(dump), script)
    assert snapshot.traceback_limit == 4


def test_program_sigterm_handler_is_respected(tmp_path):
    script = leaker(tmp_path)
    dump = tmp_path / "own.snap"
    proc = start_and_wait_ready([script, "own-handler"], ALLOCTRACE_DUMP=str(dump))
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    assert out.strip() == "own handler"
    assert_leak_in(str(dump), script)


def test_inherited_ignored_sigterm_stays_ignored(tmp_path):
    dump = tmp_path / "ign.snap"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nprint('ready', flush=True)\nsys.stdin.readline()\nprint('done')",
        ],
        env=clean_env(ALLOCTRACE_DUMP=str(dump)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN),
    )
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate("go\n", timeout=TIMEOUT)
    assert proc.returncode == 0, err
    assert out.strip() == "done"
    assert dump.exists()


def test_failed_dump_is_one_line_and_keeps_the_status(tmp_path):
    target = tmp_path / "missing-dir" / "x.snap"
    result = run(["-c", "import sys; sys.exit(4)"], ALLOCTRACE_DUMP=str(target))
    assert result.returncode == 4
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and str(target) in lines[0], result.stderr


def test_pid_and_time_placeholders_in_multi_process_program(tmp_path):
    script = write(
        tmp_path,
        "multi.py",
        """\
        import multiprocessing, os, subprocess, sys

        def work(q):
            q.put(os.getpid())
            data = [bytearray(1024) for _ in range(50)]

        if __name__ == "__main__":
            pids = [os.getpid()]
            for method in ("fork", "spawn"):
                ctx = multiprocessing.get_context(method)
                q = ctx.Queue()
                p = ctx.Process(target=work, args=(q,))
                p.start()
                pids.append(q.get(timeout=30))
                p.join(30)
                assert p.exitcode == 0, p.exitcode
            child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                                   capture_output=True, text=True, check=True)
            pids.append(int(child.stdout))
            print(" ".join(map(str, pids)))
        """,
    )
    result = run([script], cwd=tmp_path, ALLOCTRACE_DUMP=str(tmp_path / "p-{pid}-{time}.snap"))
    assert result.returncode == 0, result.stderr
    pids = [int(pid) for pid in result.stdout.split()]
    assert len(set(pids)) == 4
    files = sorted(f for f in os.listdir(tmp_path) if f.startswith("p-"))
    for pid in pids:
        matches = [f for f in files if f.startswith(f"p-{pid}-")]
        assert len(matches) == 1, (pid, files)
        snapshot = alloctrace.Snapshot.load(str(tmp_path / matches[0]))
        assert snapshot.metadata["pid"] == pid


@pytest.mark.parametrize(
    "option, forwarded",
    [("alloctrace=3", ["-X", "alloctrace=3"]), ("alloctrace", ["-X", "alloctrace"])],
)
def test_xoption_reaches_multiprocessing_children(tmp_path, option, forwarded):
    # multiprocessing passes its spawn and forkserver children -X tracemalloc, through
    # subprocess._args_from_interpreter_flags; -X alloctrace must get there the same way.
    script = write(
        tmp_path,
        "mp.py",
        """\
        import multiprocessing, subprocess, sys

        def probe(q):
            import alloctrace
            q.put((alloctrace.is_tracing(), alloctrace.get_traceback_limit()))

        if __name__ == "__main__":
            seen = {"args": subprocess._args_from_interpreter_flags()}
            # The module keeps its real loader: the import hook that wrapped the function
            # left no trace of itself.
            seen["loader"] = type(subprocess.__loader__).__name__
            from alloctrace import _after_import
            seen["watching"] = "subprocess" in _after_import._Watch.waiting
            for method in ("spawn", "forkserver"):
                ctx = multiprocessing.get_context(method)
                q = ctx.Queue()
                p = ctx.Process(target=probe, args=(q,))
                p.start()
                seen[method] = q.get(timeout=30)
                p.join(30)
            print(repr(seen))
        """,
    )
    result = run(["-X", option, script], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    seen = eval(result.stdout)
    assert seen["args"][-2:] == forwarded
    assert seen["loader"] == "SourceFileLoader" and not seen["watching"]
    nframe = int(forwarded[1].partition("=")[2] or 1)
    assert seen["spawn"] == seen["forkserver"] == (True, nframe)


def test_variables_are_not_turned_into_options():
    # With only the variable set, children inherit it; the options stay CPython's own.
    code = (
        "import subprocess, sys; "
        "watch = getattr(sys.modules.get('alloctrace._after_import'), '_Watch', None); "
        "print(subprocess._args_from_interpreter_flags(), "
        "watch is not None and 'subprocess' in watch.waiting)"
    )
    plain = run(["-c", code])
    traced = run(["-c", code], ALLOCTRACE="2")
    assert plain.returncode == traced.returncode == 0, traced.stderr
    assert "alloctrace" not in plain.stdout
    assert traced.stdout == plain.stdout


@pytest.mark.parametrize("template", ["svc.snap", "svc-{n}.snap"])
def test_interval_dumps(tmp_path, template):
    result = run(
        # Waits for three numbered dumps (a fixed 1.2 s sleep saw only two on a loaded CI
        # machine), at most 30 s; the exit dump comes after them.
        [
            "-c",
            "import os, time\nx = [bytearray(512) for _ in range(100)]\n"
            "end = time.time() + 30\n"
            "while time.time() < end and len([f for f in os.listdir('.') if f.endswith("
            "('.1.snap', '.2.snap', '.3.snap', '-1.snap', '-2.snap', '-3.snap'))]) < 3:\n"
            "    time.sleep(0.05)",
        ],
        cwd=tmp_path,
        ALLOCTRACE_DUMP=template,
        ALLOCTRACE_INTERVAL="0.25",
    )
    assert result.returncode == 0, result.stderr
    files = set(os.listdir(tmp_path))
    if template == "svc.snap":
        numbered = sorted((f for f in files if f != "svc.snap"), key=lambda f: int(f[4:-5]))
        assert "svc.snap" in files
        expected = [f"svc.{n}.snap" for n in range(1, len(numbered) + 1)]
    else:
        numbered = sorted(files, key=lambda f: int(f[4:-5]))
        expected = [f"svc-{n}.snap" for n in range(1, len(numbered) + 1)]
    assert numbered == expected
    assert len(numbered) >= 3, files
    for name in files:
        alloctrace.Snapshot.load(str(tmp_path / name))


def test_relative_dump_path_is_relative_to_the_start_directory(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    result = run(
        ["-c", "import os; os.chdir('elsewhere'); x = [bytearray(100) for _ in range(10)]"],
        cwd=tmp_path,
        ALLOCTRACE_DUMP="rel.snap",
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "rel.snap").exists()
    assert os.listdir(tmp_path / "elsewhere") == []


def test_forked_child_restarts_interval_dumps(tmp_path):
    code = textwrap.dedent(
        """\
        import os, sys, time
        pid = os.fork()
        if pid == 0:
            time.sleep(1.0)
            sys.exit(0)
        os.waitpid(pid, 0)
        print(os.getpid(), pid)
        """
    )
    result = run(
        ["-c", code],
        cwd=tmp_path,
        ALLOCTRACE_DUMP="f-{pid}-{n}.snap",
        ALLOCTRACE_INTERVAL="0.25",
    )
    assert result.returncode == 0, result.stderr
    parent, child = result.stdout.split()
    files = set(os.listdir(tmp_path))
    for pid in (parent, child):
        numbers = sorted(int(f.split("-")[2][:-5]) for f in files if f.startswith(f"f-{pid}-"))
        # Periodic snapshots from the process's own thread, then the exit one, from 1 up.
        assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 3, files
        last = alloctrace.Snapshot.load(str(tmp_path / f"f-{pid}-{numbers[-1]}.snap"))
        assert last.metadata["pid"] == int(pid)


def test_the_dumpers_own_memory_is_not_the_programs(tmp_path):
    # With object kinds, each numbered snapshot keeps the previous one to report growth: its
    # objects showed up as alloctrace/_snapshot.py lines among the program's (issue 60).
    result = run(
        [
            "-c",
            "import os, time\n"
            "data = [str(i) for i in range(50_000)]\n"
            "end = time.time() + 30\n"
            "while time.time() < end and not os.path.exists('s-4.snap'):\n"
            "    time.sleep(0.05)",
        ],
        cwd=tmp_path,
        ALLOCTRACE="1",
        ALLOCTRACE_OBJECTS="1",
        ALLOCTRACE_INTERVAL="0.2",
        ALLOCTRACE_DUMP="s-{n}.snap",
    )
    assert result.returncode == 0, result.stderr
    package = os.path.dirname(alloctrace.__file__)
    names = sorted(os.listdir(tmp_path))
    assert len(names) >= 5, names
    for name in names:
        snapshot = alloctrace.Snapshot.load(str(tmp_path / name))
        for which in (snapshot, snapshot.peak):
            files = {s.traceback[0].filename for s in which.statistics("lineno")}
            assert "<string>" in files, name
            assert not [f for f in files if f.startswith(package + os.sep)], name
