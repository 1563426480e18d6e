"""The ``alloctrace`` command and the ALLOCTRACE variables: the command never traces itself,
whatever is exported, and ``alloctrace run`` gives its program the settings of its own options
(``--objects``, ``--retention`` included), not the inherited ones."""

import os
import shutil
import subprocess
import sys

import pytest

import alloctrace
from alloctrace import _startup
from subproc import clean_env

TIMEOUT = 60

PROGRAM = """\
class Node:
    def __init__(self):
        self.payload = [bytes(300) for _ in range(3)]


kept = [Node() for _ in range(500)]
"""


def console_script():
    script = shutil.which("alloctrace", path=os.path.dirname(sys.executable))
    assert script, "the alloctrace console script is not installed next to the interpreter"
    return script


COMMANDS = {
    "console script": lambda: [console_script()],
    "python -m": lambda: [sys.executable, "-m", "alloctrace"],
    "python -X -m": lambda: [sys.executable, "-X", "alloctrace=2", "-m", "alloctrace"],
}


def command(how, *args, cwd, **env):
    return subprocess.run(
        [*COMMANDS[how](), *args],
        cwd=cwd,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


@pytest.fixture
def app(tmp_path):
    """app.snap, dumped at exit by a program run with ALLOCTRACE_DUMP."""
    (tmp_path / "prog.py").write_text(PROGRAM)
    subprocess.run(
        [sys.executable, "prog.py"],
        cwd=tmp_path,
        env=clean_env(ALLOCTRACE_DUMP="app.snap"),
        check=True,
        timeout=TIMEOUT,
    )
    return tmp_path


@pytest.mark.parametrize("how", list(COMMANDS))
def test_exported_dump_path_is_left_alone(app, how):
    before = (app / "app.snap").read_bytes()
    first = command(how, "stats", "app.snap", cwd=app, ALLOCTRACE_DUMP="app.snap")
    assert first.returncode == 0, first.stderr
    assert (app / "app.snap").read_bytes() == before
    second = command(how, "stats", "app.snap", cwd=app, ALLOCTRACE_DUMP="app.snap")
    assert second.stdout == first.stdout
    assert sorted(os.listdir(app)) == ["app.snap", "prog.py"]


def test_run_writes_only_its_own_snapshot(app):
    os.remove(app / "app.snap")
    result = command(
        "console script",
        "run",
        "-q",
        "-o",
        "child.snap",
        "prog.py",
        cwd=app,
        ALLOCTRACE_DUMP="parent.snap",
        ALLOCTRACE_INTERVAL="0.01",
    )
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(app)) == ["child.snap", "prog.py"]


@pytest.mark.parametrize(
    "env",
    [
        {"ALLOCTRACE_INTERVAL": "1"},
        {"ALLOCTRACE_OBJECTS": "1"},
        {"ALLOCTRACE_SAMPLE_SEED": "7"},
        {"ALLOCTRACE": "not a number"},
        {"ALLOCTRACE_DUMP": "elsewhere.snap", "ALLOCTRACE_SAMPLE_INTERVAL": "64KiB"},
    ],
    ids=lambda env: ",".join(env),
)
@pytest.mark.parametrize("how", ["console script", "python -m"])
def test_exported_settings_neither_break_the_command_nor_reach_the_program(app, how, env):
    stats = command(how, "stats", "app.snap", cwd=app, **env)
    assert stats.returncode == 0, stats.stderr
    assert stats.stderr == ""
    run = command(how, "run", "-q", "-o", "child.snap", "prog.py", cwd=app, **env)
    assert run.returncode == 0, run.stderr
    child = alloctrace.Snapshot.load(str(app / "child.snap"))
    # The program ran with run's defaults: exact, one frame, no object kinds.
    assert child.traceback_limit == 1
    assert not child.has_objects
    assert child._data.retention is None
    assert child.sample_interval in (None, 0)
    assert sorted(os.listdir(app)) == ["app.snap", "child.snap", "prog.py"]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["/venv/bin/python", "/venv/bin/alloctrace", "stats", "x.snap"], True),
        (["python", "-m", "alloctrace", "stats"], True),
        (["python", "-malloctrace", "stats"], True),
        (["python", "-I", "-X", "alloctrace=3", "-m", "alloctrace"], True),
        (["python", "-Im", "alloctrace"], True),
        (["python", "-m", "alloctrace_helper"], False),
        (["python", "-m", "pkg", "alloctrace"], False),
        (["python", "-c", "import alloctrace", "alloctrace"], False),
        (["python", "app.py", "-m", "alloctrace"], False),
        (["python", "alloctrace.py"], False),
        (["python"], False),
    ],
)
def test_is_command_line_tool(argv, expected):
    assert _startup.is_command_line_tool(argv) is expected


def test_run_objects_and_retention(app):
    result = command(
        "python -m",
        "run",
        "-q",
        "--objects",
        "--retention",
        "2",
        "-o",
        "kinds.snap",
        "prog.py",
        cwd=app,
    )
    assert result.returncode == 0, result.stderr
    snapshot = alloctrace.Snapshot.load(str(app / "kinds.snap"))
    assert snapshot.has_objects
    reports = snapshot._data.retention
    assert reports is not None and 1 <= len(reports) <= 2
    by_type = command("python -m", "stats", "kinds.snap", "--key", "type", cwd=app)
    assert by_type.returncode == 0, by_type.stderr
    assert "bytes" in by_type.stdout
    why = command("python -m", "why", "kinds.snap", "--line", "prog.py:3", cwd=app)
    assert why.returncode == 0, why.stderr
    assert "prog.py:3:" in why.stdout

    # --objects alone: the default number of reports.
    result = command("python -m", "run", "-q", "--objects", "-o", "d.snap", "prog.py", cwd=app)
    assert result.returncode == 0, result.stderr
    reports = alloctrace.Snapshot.load(str(app / "d.snap"))._data.retention
    assert 2 < len(reports) <= _startup.RETENTION_SITES


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--retention", "2"), "--retention needs --objects"),
        (("--objects", "--retention", "many"), "--retention 'many' is invalid"),
    ],
)
def test_run_retention_errors(app, args, needle):
    result = command("python -m", "run", *args, "prog.py", cwd=app)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"alloctrace: error: {needle}"] or needle in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_kind_and_retention_hints_name_what_works_from_the_command_line(app):
    kinds = command("python -m", "stats", "app.snap", "--key", "type", cwd=app)
    assert kinds.returncode == 1
    assert "alloctrace run --objects" in kinds.stderr
    why = command("python -m", "why", "app.snap", cwd=app)
    assert why.returncode == 1
    assert "alloctrace run --objects" in why.stderr


def test_retention_variable_sets_the_number_of_reports(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    env = clean_env(ALLOCTRACE_DUMP="r.snap", ALLOCTRACE_OBJECTS="1", ALLOCTRACE_RETENTION="1")
    subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, env=env, check=True, timeout=60)
    assert len(alloctrace.Snapshot.load(str(tmp_path / "r.snap"))._data.retention) == 1
    env = clean_env(ALLOCTRACE_DUMP="r.snap", ALLOCTRACE_RETENTION="1")
    refused = subprocess.run(
        [sys.executable, "prog.py"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert refused.returncode == 2
    assert "ALLOCTRACE_RETENTION is set but ALLOCTRACE_OBJECTS=1 is not" in refused.stderr
