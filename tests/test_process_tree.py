"""Whole process trees (issue 57): ``alloctrace run`` and ``ALLOCTRACE_CAPTURE`` put every
process's snapshot into one capture directory with a manifest; the summary and the offline
commands sum them per site, or keep them apart with ``--by-process``."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

import alloctrace
from alloctrace import _capture, _startup
from subproc import clean_env

TIMEOUT = 120


def cli(*args, cwd, **env):
    done = subprocess.run(
        [sys.executable, "-m", "alloctrace", *args],
        cwd=cwd,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    return done


def write(tmp_path, name, source):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def line_of(path, needle):
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if needle in text:
            return number
    raise AssertionError(needle)


def processes(directory):
    return _capture.load_capture(str(directory)).processes


POOL = """\
import multiprocessing, sys

_seen = []

def init(barrier):
    global _barrier
    _barrier = barrier

def work(task):
    _barrier.wait(60)  # every task in a worker of its own
    _seen.append([bytearray(100) for _ in range(30000)])  # LEAK
    return task

if __name__ == "__main__":
    ctx = multiprocessing.get_context(sys.argv[1])
    pool = ctx.Pool(3, initializer=init, initargs=(ctx.Barrier(3),))
    print(sum(pool.map(work, range(3), chunksize=1)))
    pool.close()
    pool.join()
"""


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_pool_leak_is_the_first_merged_line(tmp_path, method):
    script = write(tmp_path, "pool.py", POOL)
    done = cli("run", "--capture", "cap", str(script), method, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "3\n"
    lineno = line_of(script, "# LEAK")
    first = re.search(r"^#1: (.*)$", done.stderr, re.M).group(1)
    assert first.startswith(f"pool.py:{lineno}: ") and first.endswith(", in 3 processes"), (
        done.stderr
    )
    workers = [p for p in processes(tmp_path / "cap") if p.name and "PoolWorker" in p.name]
    assert len(workers) == 3, done.stderr
    assert all(p.code == 0 and not p.killed for p in workers), workers
    # The offline commands read the capture the same way.
    again = cli("stats", "cap", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert re.search(rf"^#1: pool\.py:{lineno}: .*, in 3 processes$", again.stdout, re.M)


def test_process_pool_executor(tmp_path):
    script = write(
        tmp_path,
        "executor.py",
        """\
        import multiprocessing, sys
        from concurrent.futures import ProcessPoolExecutor

        _seen = []

        def init(barrier):
            global _barrier
            _barrier = barrier

        def work(task):
            _barrier.wait(60)
            _seen.append([bytearray(100) for _ in range(30000)])  # LEAK
            return task

        if __name__ == "__main__":
            ctx = multiprocessing.get_context(sys.argv[1])
            with ProcessPoolExecutor(2, mp_context=ctx, initializer=init,
                                     initargs=(ctx.Barrier(2),)) as pool:
                print(sum(pool.map(work, range(2))))
        """,
    )
    done = cli("run", "--capture", "cap", str(script), "spawn", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lineno = line_of(script, "# LEAK")
    assert re.search(rf"^#1: executor\.py:{lineno}: .*, in 2 processes$", done.stderr, re.M), (
        done.stderr
    )


def test_prefork_server_leaking_worker_found_by_process(tmp_path):
    script = write(
        tmp_path,
        "prefork.py",
        """\
        import os, sys
        shared = [bytearray(64) for _ in range(1000)]
        children = []
        for index in range(4):
            pid = os.fork()
            if pid == 0:
                kept = [bytearray(100) for _ in range(20000 if index == 2 else 10)]  # WORK
                sys.exit(0)
            children.append(pid)
        for pid in children:
            os.waitpid(pid, 0)
        print(children[2])
        """,
    )
    done = cli("run", "-q", "--capture", "cap", str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    leaker = int(done.stdout)
    found = processes(tmp_path / "cap")
    assert [p.how for p in found] == ["start"] + ["fork"] * 4
    assert all(p.code == 0 for p in found), found
    by_process = cli("stats", "--by-process", "cap", cwd=tmp_path)
    assert by_process.returncode == 0, by_process.stderr
    sections = by_process.stdout.split("\n\n")
    assert len(sections) == 5
    assert sections[0].startswith(f"== pid {leaker} (fork of "), sections[0]
    lineno = line_of(script, "# WORK")
    leak = rf"^#1: prefork\.py:{lineno}: 3\.\d MiB in 40,0\d\d blocks"
    assert re.search(leak, sections[0], re.M), sections[0]
    # export and flamegraph merge the processes' snapshots into one.
    export = cli("export", "cap", "--format", "folded", "-o", "out.folded", cwd=tmp_path)
    assert export.returncode == 0, export.stderr
    folded = (tmp_path / "out.folded").read_text().splitlines()
    # Frames named by function, as in one snapshot's export.
    work = [line for line in folded if line.rsplit(" ", 1)[0].endswith(f"/prefork.py:{lineno})")]
    assert len(work) == 1 and int(work[0].rsplit(" ", 1)[1]) > 3_000_000, work
    drawn = cli("flamegraph", "cap", "-o", "out.svg", cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    assert (tmp_path / "out.svg").read_text().startswith("<?xml")


def test_subprocess_chain_three_deep(tmp_path):
    for name, child in (("a.py", "b.py"), ("b.py", "c.py"), ("c.py", None)):
        call = f"subprocess.run([sys.executable, {child!r}], check=True)" if child else "pass"
        write(
            tmp_path,
            name,
            f"""\
            import subprocess, sys
            kept_{name[0]} = [bytearray(100) for _ in range(3000)]
            {call}
            """,
        )
    done = cli("run", "--capture", "cap", "a.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = processes(tmp_path / "cap")
    assert [p.role for p in found] == ["a.py", "b.py", "c.py"]
    assert [p.ppid for p in found[1:]] == [found[0].pid, found[1].pid]
    assert all(p.code == 0 and p.snapshot for p in found)
    for name in ("a.py", "b.py", "c.py"):
        assert re.search(rf"^#\d+: {name}:2: .*, in 1 process$", done.stderr, re.M), done.stderr


def test_killed_and_exited_children_are_listed(tmp_path):
    script = write(
        tmp_path,
        "kill.py",
        """\
        import os, signal, sys, time
        r, w = os.pipe()
        killed = os.fork()
        if killed == 0:
            os.write(w, b"x")
            time.sleep(60)
        os.read(r, 1)
        os.kill(killed, signal.SIGKILL)
        os.waitpid(killed, 0)
        quitter = os.fork()
        if quitter == 0:
            os._exit(3)
        os.waitpid(quitter, 0)
        print(killed, quitter)
        """,
    )
    done = cli("run", "--capture", "cap", str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    killed, quitter = map(int, done.stdout.split())
    by_pid = {p.pid: p for p in processes(tmp_path / "cap")}
    assert by_pid[killed].killed and by_pid[killed].signal == "SIGKILL"
    assert by_pid[quitter].killed and by_pid[quitter].code == 3
    assert re.search(
        rf"^ +{killed} .*killed by SIGKILL, before its exit snapshot", done.stderr, re.M
    )
    assert re.search(rf"^ +{quitter} .*exit 3, before its exit snapshot", done.stderr, re.M)
    assert "2 processes ended without an exit snapshot" in done.stderr


def test_children_reaped_with_waitid_are_listed(tmp_path):
    # os.waitid was not watched: a child killed before its snapshot, reaped that way, was
    # listed without the signal that ended it.
    script = write(
        tmp_path,
        "waitid.py",
        """\
        import os, signal, time
        r, w = os.pipe()
        killed = os.fork()
        if killed == 0:
            os.write(w, b"x")
            time.sleep(60)
        os.read(r, 1)
        os.kill(killed, signal.SIGKILL)
        assert os.waitid(os.P_PID, killed, os.WEXITED).si_pid == killed
        quitter = os.fork()
        if quitter == 0:
            os._exit(3)
        while os.waitid(os.P_PID, quitter, os.WEXITED | os.WNOHANG) is None:
            time.sleep(0.01)
        print(killed, quitter)
        """,
    )
    done = cli("run", "--capture", "cap", str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    killed, quitter = map(int, done.stdout.split())
    by_pid = {p.pid: p for p in processes(tmp_path / "cap")}
    assert by_pid[killed].killed and by_pid[killed].signal == "SIGKILL"
    assert by_pid[quitter].killed and by_pid[quitter].code == 3


def test_many_short_lived_children_stay_readable(tmp_path):
    # A pre-fork server recycling its workers, 4 at a time: 40 of them here (200 take about
    # 30 s on a loaded 2-core machine; docs/process-trees.md gives that capture's size).
    script = write(
        tmp_path,
        "recycle.py",
        """\
        import os, sys
        running = set()
        for index in range(40):
            if len(running) == 4:
                running.discard(os.wait()[0])
            pid = os.fork()
            if pid == 0:
                kept = [bytearray(50) for _ in range(100)]
                sys.exit(0)
            running.add(pid)
        while running:
            running.discard(os.wait()[0])
        """,
    )
    done = cli("run", "-q", "--capture", "cap", str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = processes(tmp_path / "cap")
    assert len(found) == 41
    assert all(p.code == 0 and p.snapshot and not p.killed for p in found)
    files = os.listdir(tmp_path / "cap")
    # A snapshot per process (under the default bound, 100), the manifest and the list of
    # the ended processes that keep their files.
    assert len(files) == 43 and _capture.KEPT in files
    stats = cli("stats", "--json", "cap", cwd=tmp_path)
    assert stats.returncode == 0, stats.stderr
    document = json.loads(stats.stdout)
    assert len(document["processes"]) == 41
    top = [s for s in document["stats"] if s["traceback"][-1]["lineno"] == 8]
    assert top and top[0]["processes"] == 40 and top[0]["count"] >= 40 * 100


RECYCLED = """\
import multiprocessing

_seen = []

def work(task):
    _seen.append([bytearray(4000) for _ in range(1000)])  # LEAK
    return task

if __name__ == "__main__":
    pool = multiprocessing.get_context("fork").Pool(4, maxtasksperchild=1)
    print(sum(pool.map(work, range(40), chunksize=1)))
    pool.close()
    pool.join()
"""


def test_recycled_workers_keep_the_capture_bounded(tmp_path):
    # A pool whose workers each run one task (gunicorn's max_requests, maxtasksperchild):
    # at least 40 processes, each leaking 4 MB, under a bound of 6.
    script = write(tmp_path, "recycled.py", RECYCLED)
    done = cli("run", "--capture", "cap", "--capture-keep", "6", str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{sum(range(40))}\n"
    cap = tmp_path / "cap"
    capture = _capture.load_capture(str(cap))
    workers = [p for p in capture.processes if p.name and "PoolWorker" in p.name]
    assert len(workers) >= 40, done.stderr
    # Every process is listed, ended normally, with its figures at exit.
    assert all(not p.killed and p.code == 0 and p.size is not None for p in capture.processes)
    dropped = [p for p in capture.processes if p.dropped]
    # 6 ended workers keep their snapshots, and the program itself, which is never dropped.
    assert len(dropped) == len(capture.processes) - 7
    assert capture.processes[0] not in dropped
    names = sorted(os.listdir(cap))
    snaps = [name for name in names if name.endswith(".snap")]
    assert names == sorted([*snaps, "manifest.jsonl", _capture.KEPT]) and len(snaps) == 7, names
    assert {os.path.basename(p.snapshot) for p in capture.processes if p.snapshot} == set(snaps)
    manifest = (cap / "manifest.jsonl").stat().st_size
    assert manifest < 1200 * len(capture.processes), manifest
    # Every task's leak is counted at exit, 1000 blocks of 4000 bytes in its worker (the
    # pool may start a worker or two more, which run no task).
    leaked = [p for p in workers if p.size >= 1000 * 4000 and p.count >= 1000]
    assert len(leaked) == 40, [(p.pid, p.size) for p in workers]
    # The summary counts every process, folds the dropped ones into one line per parent,
    # and still puts the leak first.
    n = len(capture.processes)
    assert f"{n} processes traced into cap (7 processes with their snapshots):" in done.stderr
    root = capture.processes[0].pid
    assert re.search(
        rf"^ +{len(dropped)} +{root} .* exit 0 \({len(dropped)}\); children of {root} whose "
        "snapshots were dropped",
        done.stderr,
        re.M,
    ), done.stderr
    assert f"{len(dropped)} processes had their snapshot files dropped" in done.stderr
    lineno = line_of(script, "# LEAK")
    first = re.search(r"^#1: (.*)$", done.stderr, re.M).group(1)
    # In each kept worker that ran a task (the last ones to end may have run none).
    kept = len([p for p in leaked if p.snapshot])
    assert kept >= 1
    assert first.startswith(f"recycled.py:{lineno}: ") and first.endswith(f" in {kept} processes")
    stats = cli("stats", "--json", "cap", cwd=tmp_path)
    assert stats.returncode == 0, stats.stderr
    document = json.loads(stats.stdout)
    assert len(document["processes"]) == 7 and len(document["dropped"]) == len(dropped)
    assert document["stats"][0]["traceback"][-1]["lineno"] == lineno
    stats = cli("stats", "--limit", "1", "cap", cwd=tmp_path)
    assert stats.returncode == 0, stats.stderr
    assert f"{len(dropped)} processes had their snapshot files dropped" in stats.stderr
    assert re.search(rf"^#1: recycled\.py:{lineno}: .*, in {kept} processes$", stats.stdout, re.M)


def _fake_capture(directory, workers):
    """A capture's manifest and files: the root (pid 1), a server (pid 2) and a one-off child
    (pid 3) of it, *workers* children of the server (pids 100...), and a killed child (pid 9)
    with a numbered snapshot; the ``prune`` entries of the ended children, in end order."""
    records, entries = [], []
    for pid, ppid, started in [
        (1, 0, 0.0),
        (2, 1, 1.0),
        (3, 1, 2.0),
        *((100 + i, 2, 10.0 + i) for i in range(workers)),
    ]:
        ident = f"{pid}-{int(started * 1000)}"
        (directory / f"{ident}.snap").write_bytes(b"x")
        records.append({"event": "start", "id": ident, "pid": pid, "ppid": ppid, "time": started})
        records.append({"event": "end", "id": ident, "time": started + 1, "file": f"{ident}.snap"})
        if pid != 1:
            entries.append(
                {"id": ident, "ppid": ppid, "ended": started + 1, "files": [f"{ident}.snap"]}
            )
    records.append({"event": "start", "id": "9-1", "pid": 9, "ppid": 1, "time": 3.0})
    (directory / "9-1.1.snap").write_bytes(b"x")
    records.append({"event": "snapshot", "id": "9-1", "pid": 9, "file": "9-1.1.snap", "n": 1})
    (directory / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return entries


def _pruned(directory):
    """The ids dropped (each once), and the snapshot files left."""
    lines = (directory / "manifest.jsonl").read_text().splitlines()
    drops = [r["id"] for r in map(json.loads, lines) if r["event"] == "dropped"]
    assert len(drops) == len(set(drops)), drops
    return drops, sorted(name for name in os.listdir(directory) if name.endswith(".snap"))


def test_prune_drops_the_busiest_parents_oldest_children(tmp_path):
    entries = _fake_capture(tmp_path, 24)
    for entry in entries:
        _capture.Recorder(str(tmp_path), keep=5).prune(entry)
    drops, left = _pruned(tmp_path)
    assert len(drops) == 26 - 5
    # The root and the killed child keep theirs; of the ended children, the server, the
    # one-off child and the server's three last workers.
    assert left == sorted(
        ["1-0.snap", "2-1000.snap", "3-2000.snap", "9-1.1.snap"]
        + [f"{pid}-{(pid - 90) * 1000}.snap" for pid in (121, 122, 123)]
    )
    capture = _capture.load_capture(str(tmp_path))
    assert sorted(p.pid for p in capture.processes if p.dropped) == list(range(100, 121))
    assert all(p.snapshot is None and "dropped" in p.ending for p in capture.processes if p.dropped)
    assert [p.pid for p in capture.processes if p.killed] == [9]


def test_processes_ending_at_once_drop_each_file_once(tmp_path):
    # Eight processes end three workers each, all at once, with a bound of 5.
    entries = _fake_capture(tmp_path, 24)[2:]
    pids = []
    for share in range(8):
        pid = os.fork()
        if pid == 0:
            try:
                for entry in entries[share::8]:
                    _capture.Recorder(str(tmp_path), keep=5).prune(entry)
            finally:
                os._exit(0)
        pids.append(pid)
    for pid in pids:
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    drops, left = _pruned(tmp_path)
    assert len(drops) == 24 - 5
    kept = json.loads((tmp_path / _capture.KEPT).read_text())
    assert len(kept) == 5
    assert left == sorted(
        ["1-0.snap", "2-1000.snap", "3-2000.snap", "9-1.1.snap", *(e["files"][0] for e in kept)]
    )
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]


def test_capture_keep_is_checked(tmp_path):
    with pytest.raises(_startup.ConfigError, match="ALLOCTRACE_CAPTURE_KEEP is set but "):
        _startup.read_config({"ALLOCTRACE": "1", "ALLOCTRACE_CAPTURE_KEEP": "5"}, {}, False)
    with pytest.raises(_startup.ConfigError, match=r"ALLOCTRACE_CAPTURE_KEEP='1e3' is invalid"):
        _startup.read_config({"ALLOCTRACE_CAPTURE": "c", "ALLOCTRACE_CAPTURE_KEEP": "1e3"}, {}, 0)
    config = _startup.read_config(
        {"ALLOCTRACE_CAPTURE": "c", "ALLOCTRACE_CAPTURE_KEEP": " 0 "}, {}, False
    )
    assert config.capture_keep == 0
    done = cli("run", "--capture-keep", "-1", "x.py", cwd=tmp_path)
    assert done.returncode == 2
    assert "--capture-keep '-1' is invalid: expected a number of processes" in done.stderr
    done = cli("run", "--no-capture", "--capture-keep", "5", "x.py", cwd=tmp_path)
    assert done.returncode == 2 and "--capture-keep bounds a capture" in done.stderr


def test_diff_between_two_captures(tmp_path):
    script = write(
        tmp_path,
        "grow.py",
        """\
        import os, sys
        n = int(sys.argv[1])
        pid = os.fork()
        kept = [bytearray(100) for _ in range(n)]  # GROW
        if pid == 0:
            sys.exit(0)
        os.waitpid(pid, 0)
        """,
    )
    for name, n in (("small", "1000"), ("big", "5000")):
        done = cli("run", "-q", "--capture", name, str(script), n, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    diff = cli("diff", "small", "big", cwd=tmp_path)
    assert diff.returncode == 0, diff.stderr
    lineno = line_of(script, "# GROW")
    assert re.search(
        rf"^#1: grow\.py:{lineno}: \+1\.\d MiB \(\+16,000 blocks\)", diff.stdout, re.M
    ), diff.stdout
    assert "(2 processes) compared to small (2 processes)" in diff.stdout


def test_python_child_that_cannot_import_alloctrace_is_named(tmp_path):
    script = write(
        tmp_path,
        "untraced.py",
        """\
        import subprocess, sys
        subprocess.run([sys.executable, "-S", "-c", "pass"], check=True)
        subprocess.run(["true"], check=True)
        """,
    )
    done = cli("run", "--capture", "cap", str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert re.search(
        r"^Not traced: pid \d+, started by \d+: .* -S -c pass: .*cannot import "
        r"alloctrace",
        done.stderr,
        re.M,
    ), done.stderr
    assert "Not traced: 1 child program(s) that are not Python" in done.stderr


def test_exec_chain_and_startup_capture(tmp_path):
    # ALLOCTRACE_CAPTURE without 'run': the same layout; an os.execv'd Python is traced too.
    script = write(
        tmp_path,
        "execer.py",
        """\
        import os, sys
        kept = [bytearray(100) for _ in range(1000)]
        os.chdir("elsewhere")  # the relative capture path still names the same directory
        code = "x = [bytearray(100) for _ in range(2000)]"
        os.execv(sys.executable, [sys.executable, "-c", code])
        """,
    )
    (tmp_path / "elsewhere").mkdir()
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=clean_env(ALLOCTRACE_CAPTURE="cap"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    first, second = processes(tmp_path / "cap")
    assert first.pid == second.pid and first.end_how == "exec" and first.snapshot
    assert second.argv[-2] == "-c" and second.snapshot and not second.killed
    stats = cli("stats", "cap", cwd=tmp_path)
    assert stats.returncode == 0, stats.stderr
    # Each image's own line: the exec'd program's in its snapshot only.
    assert re.search(r"^#\d+: execer\.py:2: .*, in 1 process$", stats.stdout, re.M), stats.stdout
    assert re.search(r"^#\d+: <string>:1: .* in [45],\d{3} blocks", stats.stdout, re.M)


def test_capture_and_dump_together_is_a_config_error(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", "print('ran')"],
        env=clean_env(ALLOCTRACE_CAPTURE=str(tmp_path / "c"), ALLOCTRACE_DUMP="x.snap"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "ALLOCTRACE_CAPTURE and ALLOCTRACE_DUMP are both set" in done.stderr


def test_merge_refuses_different_limits_and_kinds():
    exact1 = alloctrace.Snapshot([(0, 10, (("a.py", 1),))], 1)
    exact1b = alloctrace.Snapshot([(0, 30, (("a.py", 1),)), (0, 5, (("b.py", 2),))], 1)
    exact2 = alloctrace.Snapshot([(0, 10, (("a.py", 1),))], 2)
    sampled = alloctrace.Snapshot([(0, 10, (("a.py", 1),))], 1, sample_interval=4096)
    merged = alloctrace.merge_snapshots([exact1, exact1b])
    assert [(str(s.traceback), s.size, s.count) for s in merged.statistics("lineno")] == [
        ("a.py:1", 40, 2),
        ("b.py:2", 5, 1),
    ]
    with pytest.raises(
        ValueError, match=r"traceback_limit=1\) with snapshot 1 \(traceback_limit=2"
    ):
        alloctrace.merge_snapshots([exact1, exact2])
    with pytest.raises(ValueError, match=r"\(exact\) with snapshot 1 \(sampled at 4096 bytes\)"):
        alloctrace.merge_snapshots([exact1, sampled])
    with pytest.raises(TypeError, match="snapshots\\[0\\] must be an alloctrace.Snapshot"):
        alloctrace.merge_snapshots([object()])
    rows = alloctrace.combined_statistics([exact1, exact1b], "lineno")
    assert [(s.size, n) for s, n in rows] == [(40, 2), (5, 1)]


def test_mixed_capture_is_refused_by_stats(tmp_path):
    for name, nframe in (("one.snap", 1), ("two.snap", 2)):
        alloctrace.Snapshot([(0, 10, (("a.py", 1),))], nframe).dump(str(tmp_path / name))
    done = cli("stats", "one.snap", "two.snap", cwd=tmp_path)
    assert done.returncode == 1
    assert "cannot merge one.snap (traceback_limit=1) with two.snap (traceback_limit=2)" in (
        done.stderr
    )


def test_run_that_cannot_start_leaves_no_capture(tmp_path):
    done = cli("run", "--capture", "cap", "missing.py", cwd=tmp_path)
    assert done.returncode == 1 and "cannot run missing.py" in done.stderr
    assert not (tmp_path / "cap").exists()
    (tmp_path / "cap").mkdir()
    (tmp_path / "cap" / "manifest.jsonl").write_text("")
    (tmp_path / "ok.py").write_text("pass\n")
    again = cli("run", "--capture", "cap", "ok.py", cwd=tmp_path)
    assert again.returncode == 1 and "cap already holds a capture" in again.stderr


def test_why_over_a_capture(tmp_path):
    script = write(tmp_path, "pool.py", POOL)
    done = cli(
        "run",
        "-q",
        "--objects",
        "--retention",
        "1",
        "--capture",
        "cap",
        str(script),
        "fork",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lineno = line_of(script, "# LEAK")
    why = cli("why", "cap", "--line", f"pool.py:{lineno}", "--limit", "1", cwd=tmp_path)
    assert why.returncode == 0, why.stderr
    sections = why.stdout.split("\n\n")
    assert len(sections) == 3, why.stdout
    for section in sections:
        assert re.match(r"== pid \d+ \(ForkPoolWorker-\d\) ==\n", section), section
        assert "__main__._seen" in section
    missing = cli("why", "cap", "--line", "pool.py:1", cwd=tmp_path)
    assert missing.returncode == 1
    assert "no snapshot of cap holds a retention report for pool.py:1" in missing.stderr


NAMED = """\
import multiprocessing, sys

def leak(n):
    global kept
    kept = [bytearray(100) for _ in range(n)]  # LEAK

def idle(n):
    pass

if __name__ == "__main__":
    ctx = multiprocessing.get_context("fork")
    n = int(sys.argv[1])
    roles = ((idle, "idle"), (leak, "leaker"))
    workers = [ctx.Process(target=f, args=(n,), name=name) for f, name in roles]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
"""


def test_diff_captures_as_json_and_by_process(tmp_path):
    script = write(tmp_path, "named.py", NAMED)
    for name, n in (("small", "1000"), ("big", "5000")):
        done = cli("run", "-q", "--capture", name, str(script), n, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    lineno = line_of(script, "# LEAK")
    # Summed per site, as JSON.
    diff = cli("diff", "--json", "--limit", "1", "small", "big", cwd=tmp_path)
    assert diff.returncode == 0, diff.stderr
    document = json.loads(diff.stdout)
    (first,) = document["stats"]
    assert (
        first["traceback"][0]["lineno"] == lineno and first["count_diff"] == 8000
    )  # an object and its buffer each
    assert len(document["processes"]["old"]) == len(document["processes"]["new"]) == 3
    assert document["new"]["path"] == "big" and document["old"]["traceback_limit"] == 1
    old_pids = {p["pid"] for p in document["processes"]["old"]}
    new_pids = {p["pid"] for p in document["processes"]["new"]}
    assert old_pids.isdisjoint(new_pids)
    # One comparison per process, matched by role whatever the pids and the argument.
    diff = cli("diff", "--by-process", "--json", "--limit", "1", "small", "big", cwd=tmp_path)
    assert diff.returncode == 0, diff.stderr
    document = json.loads(diff.stdout)
    entries = document["processes"]
    assert document["by_process"] is True and len(entries) == 3
    roles = [(e["old"]["role"], e["new"]["role"]) for e in entries]
    assert roles[0] == ("leaker", "leaker")
    assert sorted(roles[1:]) == [("idle", "idle"), ("named.py 1000", "named.py 5000")]
    leaker = entries[0]
    assert leaker["stats"][0]["traceback"][0]["lineno"] == lineno
    assert leaker["stats"][0]["count_diff"] == 8000
    # Each entry's totals are its own process's: the idle worker's barely moved.
    assert abs(leaker["total"]["count_diff"] - 8000) < 100
    idle = next(e for e in entries if e["old"]["role"] == "idle")
    assert abs(idle["total"]["count_diff"]) < 100
    text = cli("diff", "--by-process", "--limit", "1", "small", "big", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    first_header = text.stdout.splitlines()[0]
    assert re.fullmatch(
        r"== pid \d+ \(leaker\) in small -> pid \d+ \(leaker\) in big ==", first_header
    )
    assert re.search(
        rf"^#1: named\.py:{lineno}: \+\d+\.\d KiB \(\+8,000 blocks\)", text.stdout, re.M
    )
    # Not over single files, not with --peak.
    one = (tmp_path / "small").glob("*.snap").__next__()
    refused = cli("diff", "--by-process", str(one), str(one), cwd=tmp_path)
    assert refused.returncode == 2
    assert "diff --by-process compares two capture directories" in refused.stderr


def fake(pid, ppid, started, argv, name=None):
    process = _capture.CaptureProcess(
        {"id": f"{pid}-{started}", "pid": pid, "ppid": ppid, "time": started, "argv": argv}
    )
    process.name = name
    return process


def test_processes_are_matched_by_role_not_pid():
    old = [
        fake(10, 1, 1.0, ["python", "app.py", "1"]),
        fake(11, 10, 2.0, ["python", "app.py", "1"]),  # a fork
        fake(12, 10, 3.0, ["python", "-c", "spawn"], "SpawnPoolWorker-1"),
        fake(13, 11, 4.0, ["python", "app.py", "1"]),  # the fork's fork
    ]
    new = [
        fake(20, 1, 1.0, ["python", "app.py", "2"]),
        fake(21, 20, 2.0, ["python", "-c", "spawn"], "SpawnPoolWorker-1"),  # started first here
        fake(22, 20, 3.0, ["python", "app.py", "2"]),
        fake(23, 20, 4.0, ["python", "app.py", "2"]),  # a fork the old run did not make
        fake(24, 23, 5.0, ["python", "app.py", "2"]),
    ]
    pairs = _capture.match_processes(old, new)
    named = [
        (None if i is None else old[i].pid, None if j is None else new[j].pid) for i, j in pairs
    ]
    assert sorted(named, key=str) == sorted(
        [(10, 20), (11, 22), (12, 21), (13, None), (None, 23), (None, 24)], key=str
    )


def test_merged_exports_name_functions(tmp_path):
    script = write(
        tmp_path,
        "named_fn.py",
        """\
        import os, sys

        def fill_cache(n):
            return [bytearray(500) for _ in range(n)]  # FILL

        kept = fill_cache(2000)
        pid = os.fork()
        more = fill_cache(1000)
        if pid == 0:
            sys.exit(0)
        os.waitpid(pid, 0)
        """,
    )
    done = cli("run", "-q", "-n", "3", "--capture", "cap", str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lineno = line_of(script, "# FILL")
    folded = cli("export", "--format", "folded", "-o", "-", "cap", cwd=tmp_path)
    assert folded.returncode == 0, folded.stderr
    # Both processes' lines of fill_cache, named as a single snapshot's export names them
    # (merging used to keep file:line only).
    mine = [line for line in folded.stdout.splitlines() if f"named_fn.py:{lineno})" in line]
    assert mine, folded.stdout[:2000]
    # (3.9-3.11 run the comprehension in a frame of its own: fill_cache.<locals>.<listcomp>.)
    assert all(";fill_cache" in line for line in mine), mine
    total = sum(int(line.rsplit(" ", 1)[1]) for line in mine)
    assert total >= 2 * 3000 * 500  # kept and more, in the parent and in the child
    snapshots = [alloctrace.Snapshot.load(str(p)) for p in (tmp_path / "cap").glob("*.snap")]
    merged = alloctrace.merge_snapshots(snapshots)
    assert len(snapshots) == 2 and merged.traceback_limit == 3
    assert len(merged.traces) == sum(len(s.traces) for s in snapshots)
    frames, _ = merged._data.flame(1000)
    assert any(frame is not None and frame[2] == "fill_cache" for frame in frames)
