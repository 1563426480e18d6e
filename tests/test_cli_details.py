"""The smaller findings of a new user's walk-through of the command line (issue 14): every
hint names the option that works, --json everywhere, the --version and --help texts, filters
that match nothing, swapped diffs, programs that never start, and start-up lines."""

import argparse
import inspect
import json
import os
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest

import alloctrace
from alloctrace import _startup
from subproc import clean_env

TIMEOUT = 60
REPO = pathlib.Path(__file__).resolve().parent.parent


def cli(*args, cwd, **env):
    return subprocess.run(
        [sys.executable, "-m", "alloctrace", *args],
        cwd=cwd,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def python(*args, cwd, **env):
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


@pytest.fixture(scope="module")
def snaps(tmp_path_factory):
    """first.snap, then second.snap a few seconds... of metadata later, of one small program."""
    base = tmp_path_factory.mktemp("details")
    (base / "app.py").write_text("kept = [bytearray(2000) for _ in range(300)]\n")
    for name in ("first", "second"):
        done = python("app.py", cwd=base, ALLOCTRACE_DUMP=f"{name}.snap")
        assert done.returncode == 0, done.stderr
    # Timestamps are whole-second apart at least in the metadata we compare: set them apart.
    for name, stamp in (("first", 1_000_000_000.0), ("second", 1_000_000_060.0)):
        snapshot = alloctrace.Snapshot.load(str(base / f"{name}.snap"))
        snapshot.metadata["timestamp"] = stamp
        snapshot.dump(str(base / f"{name}.snap"))
    return base


def test_pickle_error_names_the_option(tmp_path):
    done = python(
        "-c",
        "import tracemalloc; tracemalloc.start(); tracemalloc.take_snapshot().dump('tm.pickle')",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    refused = cli("stats", "tm.pickle", cwd=tmp_path)
    assert refused.returncode == 1
    assert "--allow-pickle" in refused.stderr
    assert "allow_pickle=True" not in refused.stderr


def test_top_json_is_stats_json(snaps):
    top = cli("top", "second.snap", "--json", cwd=snaps)
    stats = cli("stats", "second.snap", "--json", cwd=snaps)
    assert top.returncode == 0, top.stderr
    assert json.loads(top.stdout) == json.loads(stats.stdout)


def test_why_json_has_a_version(tmp_path):
    (tmp_path / "app.py").write_text("kept = [bytearray(2000) for _ in range(300)]\n")
    run = cli("run", "-q", "--objects", "--retention", "1", "-o", "w.snap", "app.py", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    why = cli("why", "w.snap", "--json", cwd=tmp_path)
    assert why.returncode == 0, why.stderr
    document = json.loads(why.stdout)
    assert document["version"] == 1 and document["command"] == "why"
    assert document["reports"][0]["lineno"] == 1


def test_export_format_folded_is_collapsed(snaps, tmp_path):
    folded = cli(
        "export", "second.snap", "--format", "folded", "-o", str(tmp_path / "f"), cwd=snaps
    )
    assert folded.returncode == 0, folded.stderr
    collapsed = cli(
        "export", "second.snap", "--format", "collapsed", "-o", str(tmp_path / "c"), cwd=snaps
    )
    assert collapsed.returncode == 0, collapsed.stderr
    assert (tmp_path / "f").read_text() == (tmp_path / "c").read_text() != ""


def test_version(tmp_path):
    done = cli("--version", cwd=tmp_path)
    assert done.returncode == 0
    assert done.stdout.strip() == f"alloctrace {alloctrace.__version__}"


def test_help_describes_every_subcommand_and_variable(tmp_path):
    top = cli("--help", cwd=tmp_path)
    # Every variable the start-up code reads, and no pointer at docs/, which pip users lack.
    source = (REPO / "python" / "alloctrace" / "_startup.py").read_text()
    source += (REPO / "python" / "alloctrace" / "_memory_limit.py").read_text()
    read = set(re.findall(r'"(ALLOCTRACE(?:_[A-Z]+)*)"', source)) - {"ALLOCTRACE_DATA"}
    assert "ALLOCTRACE_NATIVE" in read and "ALLOCTRACE_REATTRIBUTE" in read
    listed = set(re.findall(r"^  (ALLOCTRACE(?:_[A-Z]+)*)=", top.stdout, re.MULTILINE))
    assert read <= listed, read - listed
    assert "docs/" not in top.stdout
    for command in ("stats", "top", "diff", "export", "flamegraph", "why", "report", "snapshot"):
        helped = cli(command, "--help", cwd=tmp_path)
        assert helped.returncode == 0
        # argparse prints the description between the usage and the options.
        between = helped.stdout.split("\n\n")[1]
        assert not between.lstrip().startswith(("positional", "options")), (command, between)


def test_include_matching_nothing_says_why(snaps):
    done = cli("stats", "second.snap", "--include", "app.py", cwd=snaps)
    assert done.returncode == 0, done.stderr
    note = done.stderr.strip()
    assert note.startswith("alloctrace: note: no block of second.snap is left")
    assert "--include 'app.py' matches no file" in note
    assert f"write '*/app.py' to match {str(snaps / 'app.py')!r}" in note
    # An export is written (empty), with the same note; a flamegraph cannot be drawn empty.
    args = ("second.snap", "-o", "x", "--include", "app.py")
    export = cli("export", *args, "--format", "folded", cwd=snaps)
    assert export.returncode == 0
    assert export.stderr.startswith("alloctrace: note: no block of second.snap is left: ")
    assert (snaps / "x").read_text() == ""
    os.remove(snaps / "x")
    drawn = cli("flamegraph", *args, cwd=snaps)
    assert drawn.returncode == 1
    assert drawn.stderr.startswith("alloctrace: error: no block of second.snap is left: ")
    assert not (snaps / "x").exists()
    # A pattern that matches says nothing.
    quiet = cli("stats", "second.snap", "--include", "*/app.py", cwd=snaps)
    assert quiet.stderr == "" and "app.py:1" in quiet.stdout


def test_swapped_diff_warns(snaps):
    swapped = cli("diff", "second.snap", "first.snap", cwd=snaps)
    assert swapped.returncode == 0, swapped.stderr
    assert swapped.stderr.startswith("alloctrace: warning: OLD (second.snap, taken ")
    assert "is newer than NEW (first.snap" in swapped.stderr
    ordered = cli("diff", "first.snap", "second.snap", cwd=snaps)
    assert ordered.stderr == ""


@pytest.mark.parametrize(
    "program, needle",
    [
        (("broken.py",), "cannot run broken.py: SyntaxError: "),
        (("-m", "no_such_module_here"), "cannot run -m no_such_module_here: No module named"),
        (("-c", "def f(:"), "cannot run -c: SyntaxError: "),
    ],
)
def test_run_of_a_program_that_never_starts_writes_nothing(tmp_path, program, needle):
    (tmp_path / "broken.py").write_text("print('hi')\ndef f(:\n    pass\n")
    done = cli("run", "-o", "never.snap", *program, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith(f"alloctrace: error: {needle}"), done.stderr
    assert "nothing was run or written" in done.stderr
    assert not (tmp_path / "never.snap").exists()


@pytest.mark.parametrize(
    "args, needle",
    [
        (("stats", "--limt", "3", "x.snap"), "--limt (did you mean --limit?)"),
        (("diff", "a.snap", "b.snap", "--cumulatve"), "--cumulatve (did you mean --cumulative?)"),
        (("stats", "x.snap", "--zzz"), "unrecognized arguments: --zzz (see 'alloctrace stats"),
    ],
)
def test_misspelt_option_suggests_the_known_one(tmp_path, args, needle):
    done = cli(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert needle in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1


def test_run_of_an_interpreter_says_to_drop_it(tmp_path):
    done = cli("run", "python", "app.py", cwd=tmp_path, PATH=os.path.dirname(sys.executable))
    assert done.returncode == 1
    assert "python is an interpreter: alloctrace run takes what follows it, as in " in done.stderr
    assert "'alloctrace run app.py'" in done.stderr
    done = cli("run", "ls", cwd=tmp_path, PATH="/usr/bin:/bin")
    assert "ls is a command (" in done.stderr and "takes a Python script" in done.stderr


def test_run_still_runs_modules_directories_and_zip_archives(tmp_path):
    code = "kept = [bytearray(500) for _ in range(50)]\n"
    (tmp_path / "here_mod.py").write_text(code)
    (tmp_path / "app_dir").mkdir()
    (tmp_path / "app_dir" / "__main__.py").write_text(code)
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as archive:
        archive.writestr("__main__.py", code)
    for name, program in (
        ("m", ("-m", "here_mod")),
        ("d", ("app_dir",)),
        ("z", ("app.zip",)),
    ):
        done = cli("run", "-q", "-o", f"{name}.snap", *program, cwd=tmp_path)
        assert done.returncode == 0, (program, done.stderr)
        assert (tmp_path / f"{name}.snap").exists()


def test_snapshots_are_git_ignored():
    assert "*.snap" in (REPO / ".gitignore").read_text().splitlines()


def test_exit_dump_machinery_is_not_in_the_program_snapshot(tmp_path):
    (tmp_path / "app.py").write_text("kept = [bytearray(2000) for _ in range(30)]\n")
    done = python("app.py", cwd=tmp_path, ALLOCTRACE_DUMP="a.snap", ALLOCTRACE_INTERVAL="30")
    assert done.returncode == 0, done.stderr
    snapshot = alloctrace.Snapshot.load(str(tmp_path / "a.snap"))
    startup = os.path.join(os.path.dirname(alloctrace.__file__), "_startup.py")
    # The lines that set the exit dumps up at start-up (not those that write them at exit).
    setup = set()
    for function in (
        _startup.install,
        _startup.Dumper.__init__,
        _startup.Dumper.install,
        _startup.Dumper._install_sigterm,
        _startup.Dumper._start_thread,
    ):
        lines, first = inspect.getsourcelines(function)
        setup.update(range(first, first + len(lines)))
    ours = [
        stat
        for stat in snapshot.statistics("lineno")
        if stat.traceback[0].filename == startup and stat.traceback[0].lineno in setup
    ]
    assert ours == []


def test_why_shortens_file_names_as_stats_does():
    # why printed site-packages and standard-library paths in full, where stats shortens them.
    from alloctrace._commands import why

    site = "/venv/lib/python3.11/site-packages/pkg/cache.py"
    text = f"{site}:3: 5 live objects\n  5 held by 1 × dict ({site}:9), 1 × list (/opt/x y.py:2)"

    class Report:
        def __str__(self):
            return text

    short = why._text([Report()], argparse.Namespace(full_paths=False))
    expected = "pkg/cache.py:3: 5 live objects\n  5 held by 1 × dict (pkg/cache.py:9)"
    assert short == expected + ", 1 × list (/opt/x y.py:2)"
    assert why._text([Report()], argparse.Namespace(full_paths=True)) == text


def test_a_process_series_in_a_directory_counts_once(tmp_path):
    # A directory of one process's numbered snapshots and its exit snapshot (app.1.snap,
    # app.2.snap, app.snap) next to another process's: stats summed every file, counting the
    # first process's memory once per snapshot.
    program = (
        "import os, sys, time\n"
        "keep = [bytearray(1000) for _ in range(2000)]\n"
        "end = time.time() + 30\n"
        "while len(sys.argv) > 1 and time.time() < end and not os.path.exists('app.2.snap'):\n"
        "    time.sleep(0.02)\n"
    )
    (tmp_path / "prog.py").write_text(program)
    for dump, extra in (("app.snap", ["series"]), ("other.snap", [])):
        done = python(
            "prog.py",
            *extra,
            cwd=tmp_path,
            ALLOCTRACE="1",
            ALLOCTRACE_DUMP=dump,
            ALLOCTRACE_INTERVAL="0.1",
        )
        assert done.returncode == 0, done.stderr
    names = sorted(os.listdir(tmp_path))
    assert {"app.snap", "app.1.snap", "app.2.snap", "other.snap"} <= set(names), names
    totals = {}
    for name in ("app.snap", "other.snap"):
        snapshot = alloctrace.Snapshot.load(str(tmp_path / name))
        totals[name] = sum(s.size for s in snapshot.statistics("lineno"))
    (tmp_path / "prog.py").unlink()
    done = cli("stats", ".", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["total"]["size"] == totals["app.snap"] + totals["other.snap"]
    assert sorted(p["path"] for p in document["processes"]) == ["./app.snap", "./other.snap"]
    shown = cli("stats", ".", cwd=tmp_path)
    assert shown.stdout.startswith("Top 10 lines summed over 2 processes"), shown.stdout
    assert "pid " in shown.stderr and "./app.snap is used, the latest of its" in shown.stderr
