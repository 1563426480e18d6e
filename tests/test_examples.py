"""Every program in ``examples/`` runs, quickly, and shows what its docstring promises."""

import os
import pathlib
import subprocess
import sys

import alloctrace
from subproc import clean_env

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
TIMEOUT = 60


def run(args, cwd, **env):
    result = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    return result


def line_of(example, text):
    """The line number of the first line of *example* containing *text*."""
    lines = (EXAMPLES / example).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line)


def test_leak_quick_start(tmp_path):
    result = run(
        ["-m", "alloctrace", "run", "-o", "leak.snap", str(EXAMPLES / "leak.py"), "3000"],
        tmp_path,
    )
    assert result.stdout.startswith("served 3000 requests, ")
    err = result.stderr.splitlines()
    leak_line = line_of("leak.py", "_cache[request_id] = bytearray(1024)")
    assert err[1].startswith(f"#1: {EXAMPLES / 'leak.py'}:{leak_line}: ")
    assert err[2].strip() == "_cache[request_id] = bytearray(1024)"
    # Its peak is its end: one line says so instead of a second listing of the same lines.
    assert "at the peak of" not in result.stderr
    assert err[-3].startswith("(the peak, ") and "was within a tenth of the end: " in err[-3]
    assert "'alloctrace stats --peak leak.snap' shows it" in err[-3]
    assert err[-2].startswith("alloctrace: snapshot written to leak.snap")
    # One line holds most of the memory: how to ask what keeps it alive.
    assert err[-1].startswith(f"alloctrace: leak.py:{leak_line} holds "), err[-1]
    assert "run again with 'alloctrace run --objects ...', then 'alloctrace why FILE'" in err[-1]


def test_pool_leak_whole_tree(tmp_path):
    result = run(
        ["-m", "alloctrace", "run", "--capture", "cap", str(EXAMPLES / "pool_leak.py"), "fork"],
        tmp_path,
    )
    assert result.stdout.startswith("6000 tasks done by fork workers")
    err = result.stderr.splitlines()
    assert err[0] == "5 processes traced into cap:"
    leak_line = line_of("pool_leak.py", "_seen[task] = bytearray(4096)")
    first = next(line for line in err if line.startswith("#1: "))
    assert first.startswith(f"#1: {EXAMPLES / 'pool_leak.py'}:{leak_line}: ")
    # Each worker that ran a task leaked; four workers, 6000 tasks in chunks of 25.
    assert first.endswith((", in 4 processes", ", in 3 processes")), first


def test_find_leak(tmp_path):
    result = run([str(EXAMPLES / "find_leak.py")], tmp_path)
    lines = result.stdout.splitlines()
    assert lines[0] == "Top 3 differences:"
    leak_line = line_of("find_leak.py", "self.seen.append(words)")
    # The words lists kept by the class-level list grow the most.
    assert lines[1].strip().startswith(f"{EXAMPLES / 'find_leak.py'}:{leak_line - 1}: size=")


def test_in_code(tmp_path):
    result = run([str(EXAMPLES / "in_code.py"), "work.snap"], tmp_path)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Biggest: ")
    row_line = line_of("in_code.py", 'return {"id": i')
    assert lines[-3] == f'  File "{EXAMPLES / "in_code.py"}", line {row_line}'
    assert lines[-1].startswith("snapshot written to work.snap")
    snapshot = alloctrace.Snapshot.load(str(tmp_path / "work.snap"))
    assert snapshot.traceback_limit == 10


def test_service_with_interval_then_offline_diff(tmp_path):
    result = run(
        [str(EXAMPLES / "service.py"), "--seconds", "1.3"],
        tmp_path,
        ALLOCTRACE_DUMP="service-{n}.snap",
        ALLOCTRACE_INTERVAL="0.3",
    )
    assert result.stdout.startswith("served ")
    dumps = sorted(os.listdir(tmp_path), key=lambda name: int(name[len("service-") : -5]))
    assert len(dumps) >= 4, dumps
    first, last = dumps[0], dumps[-1]
    session_line = line_of("service.py", "_sessions.setdefault")

    diff = run([str(EXAMPLES / "diff_dumps.py"), first, last], tmp_path)
    lines = diff.stdout.splitlines()
    assert lines[0].startswith(f"{last} compared to {first} (pid ")
    assert lines[1].strip().startswith(f"{EXAMPLES / 'service.py'}:{session_line}: size=")

    cli = run(["-m", "alloctrace", "diff", first, last, "--include", "*service.py"], tmp_path)
    lines = cli.stdout.splitlines()
    # Both dumps recorded the process's memory: its change is under the title.
    assert lines[1].startswith("(RSS ") and "; traced " in lines[1], cli.stdout
    assert f"service.py:{session_line}: +" in lines[2]


def test_why_leak_diff_then_why(tmp_path):
    result = run([str(EXAMPLES / "why_leak.py"), "before.snap", "after.snap"], tmp_path)
    assert result.stdout.strip() == "500 sessions, 21000 entries"
    leak_line = line_of("why_leak.py", "session.history.append(bytes(200))")
    diff = run(["-m", "alloctrace", "diff", "before.snap", "after.snap", "--limit", "1"], tmp_path)
    assert f"why_leak.py:{leak_line}: +" in diff.stdout
    why = run(
        ["-m", "alloctrace", "why", "after.snap", "--line", f"why_leak.py:{leak_line}"], tmp_path
    )
    lines = why.stdout.splitlines()
    assert lines[0].startswith(f"{EXAMPLES / 'why_leak.py'}:{leak_line}: 21,000 live objects")
    if sys.version_info >= (3, 11):
        # Attributes live in the object: the history lists are held by the sessions.
        holder = "__main__.Session", line_of("why_leak.py", "= Session(client)")
    else:
        # Each session's __dict__, made by its first attribute assignment, holds them.
        holder = "dict", line_of("why_leak.py", "self.client = client")
    assert f"× {holder[0]} ({EXAMPLES / 'why_leak.py'}:{holder[1]})" in why.stdout
    assert "  __main__._sessions → dict['client-" in why.stdout
    assert "Session.__dict__['history'] → list[" in why.stdout


def test_kinds_through_run_objects(tmp_path):
    cli = ["-m", "alloctrace"]
    run([*cli, "run", "-q", "--objects", "-o", "kinds.snap", str(EXAMPLES / "kinds.py")], tmp_path)
    history = line_of("kinds.py", "self.history = [")
    by_type = run([*cli, "stats", "kinds.snap", "--key", "type", "--limit", "5"], tmp_path)
    assert by_type.stdout.splitlines()[1].startswith("#1: str: ")
    by_line = run([*cli, "stats", "kinds.snap", "--key", "lineno+type", "--limit", "4"], tmp_path)
    top = by_line.stdout.splitlines()[1]
    assert top.startswith(f"#1: {EXAMPLES / 'kinds.py'}:{history}: str: ")
    assert " in 60,000 blocks " in top
    assert f"kinds.py:{history}: list (items): " in by_line.stdout


def test_catalog_exports(tmp_path):
    result = run([str(EXAMPLES / "catalog.py"), "catalog.snap"], tmp_path)
    assert result.stdout.startswith("5000 items, ")
    snapshot = alloctrace.Snapshot.load(str(tmp_path / "catalog.snap"))
    assert snapshot.traceback_limit == 25
    cli = ["-m", "alloctrace"]
    run([*cli, "export", "catalog.snap", "--format", "pprof", "-o", "heap.pb.gz"], tmp_path)
    run([*cli, "flamegraph", "catalog.snap", "-o", "heap.svg"], tmp_path)
    assert (tmp_path / "heap.pb.gz").read_bytes()[:2] == b"\x1f\x8b"
    # The function's qualified name from 3.11 (co_qualname), its plain name before.
    assert "add_to_index (" in (tmp_path / "heap.svg").read_text()


def test_rss_vs_traced(tmp_path):
    import re

    result = run([str(EXAMPLES / "rss_vs_traced.py")], tmp_path)
    rows = {}
    for line in result.stdout.splitlines()[:5]:
        step = line.split()[0]
        figures = re.findall(r"(?:traced|RSS|anonymous|tracer)\s+([\d.]+)", line)
        rows[step] = [float(f) for f in figures]
    traced, rss, anon, tracer = 0, 1, 2, 3
    # Freeing 9 in 10 small objects gives the traced memory back, not the resident memory
    # (less the tracer's own, whose table shrinks as the blocks go).
    assert rows["2b."][traced] < rows["2a."][traced] / 5
    program = {step: rows[step][rss] - rows[step][tracer] for step in ("2a.", "2b.")}
    assert program["2b."] > program["2a."] * 0.8, rows
    # An anonymous mapping is resident and anonymous, but untraced.
    assert rows["3."][anon] - rows["2b."][anon] >= 60
    assert abs(rows["3."][traced] - rows["2b."][traced]) < 1
    assert result.stdout.splitlines()[-1].startswith("snapshot: traced ")


def test_pytest_memory(tmp_path):
    """docs/pytest.md's failure messages: two tests fail on purpose, two pass."""
    example = EXAMPLES / "pytest_memory.py"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(example)],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    out = result.stdout
    assert "2 failed, 2 passed" in out, out
    assert "limit_memory: the test was limited to 1.0 MiB but its body allocated 2." in out
    leak = line_of("pytest_memory.py", 'session = {"user"')
    assert f"pytest_memory.py:{leak}: " in out and " KiB per run (" in out, out
    assert "kinds: str " in out and "held by: pytest_memory.SESSIONS" in out


def test_native_example(tmp_path):
    result = run([str(EXAMPLES / "native.py")], tmp_path)
    off, on = result.stdout.split("native=True:\n")
    line = line_of("native.py", "return [hashlib")
    assert f"native.py:{line}: " in off and f"native.py:{line}: " in on
    assert off.rstrip().endswith("of which in the native domain: 0 KiB")
    # 2000 OpenSSL hash contexts: a few hundred bytes each (on every OpenSSL seen, > 100 KiB).
    native_kib = int(on.rsplit(": ", 1)[1].split()[0])
    assert native_kib > 100


def test_unclosed_file_warning(tmp_path):
    """docs/tracemalloc-compatibility.md's ResourceWarning, the same as under -X tracemalloc."""
    example = str(EXAMPLES / "unclosed.py")
    shown = {
        tracer: run([f"-X{tracer}=5", "-Walways", example], tmp_path).stderr
        for tracer in ("tracemalloc", "alloctrace")
    }
    assert shown["alloctrace"] == shown["tracemalloc"]
    lines = shown["alloctrace"].splitlines()
    assert lines[2] == "Object allocated at (most recent call last):"
    assert lines[-2:] == [
        f'  File "{example}", lineno {line_of("unclosed.py", "return open(os.devnull)")}',
        "    return open(os.devnull)",
    ]
    untraced = run(["-Walways", example], tmp_path).stderr
    assert untraced.endswith("Enable tracemalloc to get the object allocation traceback\n")
