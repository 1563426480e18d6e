"""The ``alloctrace`` command line on real snapshots dumped by traced programs: ``run``,
``stats``, ``top`` and ``diff`` in text and JSON, filters, and one-line errors."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

import alloctrace
from alloctrace import _report
from subproc import clean_env

TIMEOUT = 60

GROWER = """\
import sys

kept = []


def grow(n):
    for _ in range(n):
        kept.append(bytearray(1000))


def helper_noise():
    return [str(i) * 3 for i in range(50)]


noise = helper_noise()
grow(int(sys.argv[1]))
"""


def cli(*args, cwd=None, env=None, input=None):
    return subprocess.run(
        [sys.executable, "-m", "alloctrace", *args],
        cwd=cwd,
        env=env if env is not None else clean_env(),
        input=input,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


@pytest.fixture(scope="module")
def snaps(tmp_path_factory):
    """Two snapshots of the same program, the second after more growth (3 frames each)."""
    base = tmp_path_factory.mktemp("snaps")
    script = base / "grower.py"
    script.write_text(GROWER)
    paths = {}
    for name, n in (("old", 100), ("new", 2000)):
        path = base / f"{name}.snap"
        subprocess.run(
            [sys.executable, str(script), str(n)],
            env=clean_env(ALLOCTRACE="3", ALLOCTRACE_DUMP=str(path)),
            check=True,
            timeout=TIMEOUT,
        )
        paths[name] = str(path)
    paths["script"] = str(script)
    paths["dir"] = str(base)
    new = alloctrace.Snapshot.load(paths["new"])
    old = alloctrace.Snapshot.load(paths["old"])
    paths["leak"] = next(s for s in new.statistics("lineno") if s.traceback[0].lineno == 8)
    paths["growth"] = next(s for s in new.compare_to(old, "lineno") if s.traceback[0].lineno == 8)
    return paths


def entries(stdout):
    return [line for line in stdout.splitlines() if line.startswith("#")]


def test_stats_text(snaps):
    result = cli("stats", "new.snap", cwd=snaps["dir"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Top 10 lines in new.snap (traceback_limit=3")
    top = entries(result.stdout)
    assert len(top) == 10
    # Shortened relative to the current directory, with the size, the count and the source.
    leak = snaps["leak"]
    assert top[0].startswith(
        f"#1: grower.py:8: {_report.format_size(leak.size)} in {leak.count:,} blocks"
    )
    assert lines[lines.index(top[0]) + 1].strip() == "kept.append(bytearray(1000))"
    assert " other: " in lines[-2]
    assert lines[-1].startswith("Total: ")


def test_top_is_stats_with_defaults(snaps):
    top = cli("top", snaps["new"], cwd=snaps["dir"])
    stats = cli("stats", snaps["new"], cwd=snaps["dir"])
    assert top.returncode == 0 and top.stdout == stats.stdout


def test_stats_json_is_consistent(snaps):
    result = cli("stats", snaps["new"], "--json", "--limit", "5")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["version"] == 1 and doc["command"] == "stats"
    assert doc["key_type"] == "lineno" and doc["cumulative"] is False
    assert doc["snapshot"]["path"] == snaps["new"]
    assert doc["snapshot"]["traceback_limit"] == 3
    assert doc["snapshot"]["metadata"]["argv"][-1] == "2000"
    assert len(doc["stats"]) == 5
    sizes = [s["size"] for s in doc["stats"]]
    assert sizes == sorted(sizes, reverse=True)
    assert doc["stats"][0]["traceback"] == [{"filename": snaps["script"], "lineno": 8}]
    assert doc["total"]["size"] == sum(sizes) + doc["other"]["size"]
    assert doc["total"]["count"] == sum(s["count"] for s in doc["stats"]) + doc["other"]["count"]
    # Same figures as the API.
    snapshot = alloctrace.Snapshot.load(snaps["new"])
    expected = snapshot.statistics("lineno")[:5]
    assert [(s["size"], s["count"]) for s in doc["stats"]] == [(s.size, s.count) for s in expected]


def test_stats_key_filename_and_traceback(snaps):
    result = cli("stats", snaps["new"], "--key", "filename", "--json", "--limit", "0")
    doc = json.loads(result.stdout)
    names = [s["traceback"][0]["filename"] for s in doc["stats"]]
    assert len(names) == len(set(names)) and snaps["script"] in names
    assert doc["other"]["entries"] == 0

    result = cli("stats", snaps["new"], "--key", "traceback", "--limit", "1", cwd=snaps["dir"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    leak = snaps["leak"]
    assert lines[1].startswith(f"#1: {_report.format_size(leak.size)} in {leak.count:,} blocks")
    # Oldest frame first, the allocation site last, each with its source line.
    assert lines[2:6] == [
        "    grower.py:16",
        "        grow(int(sys.argv[1]))",
        "    grower.py:8",
        "        kept.append(bytearray(1000))",
    ]


def test_stats_cumulative(snaps):
    result = cli("stats", snaps["new"], "--cumulative", "--json", "--limit", "0")
    doc = json.loads(result.stdout)
    by_line = {(s["traceback"][0]["filename"], s["traceback"][0]["lineno"]) for s in doc["stats"]}
    # The caller's line only appears when every frame counts.
    assert (snaps["script"], 16) in by_line
    assert doc["other"] == {"entries": 0, "size": None, "count": None}
    plain = json.loads(cli("stats", snaps["new"], "--json", "--limit", "0").stdout)
    assert (snaps["script"], 16) not in {
        (s["traceback"][0]["filename"], s["traceback"][0]["lineno"]) for s in plain["stats"]
    }


def test_include_and_exclude(snaps):
    included = json.loads(
        cli("stats", snaps["new"], "--json", "--limit", "0", "--include", "*grower.py").stdout
    )
    assert included["stats"]
    assert all(f["filename"] == snaps["script"] for s in included["stats"] for f in s["traceback"])
    assert included["filters"] == [{"inclusive": True, "pattern": "*grower.py"}]
    excluded = json.loads(
        cli("stats", snaps["new"], "--json", "--limit", "0", "--exclude", "*grower.py").stdout
    )
    assert excluded["stats"]
    assert all(s["traceback"][-1]["filename"] != snaps["script"] for s in excluded["stats"])
    full = json.loads(cli("stats", snaps["new"], "--json").stdout)
    assert included["total"]["size"] + excluded["total"]["size"] == full["total"]["size"]


def test_diff_text_and_json(snaps):
    result = cli("diff", "old.snap", "new.snap", cwd=snaps["dir"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Top ") and "new.snap compared to old.snap" in lines[0]
    top = entries(result.stdout)
    growth = snaps["growth"]
    assert top[0].startswith(
        f"#1: grower.py:8: {_report.format_size(growth.size_diff, True)} "
        f"(+{growth.count_diff:,} blocks), now {_report.format_size(growth.size)}"
    )
    assert lines[-1].startswith("Total: +")

    doc = json.loads(cli("diff", snaps["old"], snaps["new"], "--json", "--limit", "0").stdout)
    assert doc["version"] == 1 and doc["command"] == "diff"
    assert doc["old"]["path"] == snaps["old"] and doc["new"]["path"] == snaps["new"]
    first = doc["stats"][0]
    assert first["traceback"] == [{"filename": snaps["script"], "lineno": 8}]
    assert first["count_diff"] == snaps["growth"].count_diff
    assert first["size_diff"] == snaps["growth"].size_diff > 1900 * 1000
    assert all(s["size_diff"] or s["count_diff"] for s in doc["stats"])
    old = json.loads(cli("stats", snaps["old"], "--json").stdout)["total"]
    new = json.loads(cli("stats", snaps["new"], "--json").stdout)["total"]
    assert doc["total"] == {
        "size": new["size"],
        "size_diff": new["size"] - old["size"],
        "count": new["count"],
        "count_diff": new["count"] - old["count"],
    }
    # In compare_to's order.
    api = alloctrace.Snapshot.load(snaps["new"]).compare_to(
        alloctrace.Snapshot.load(snaps["old"]), "lineno"
    )
    changed = [(s.size_diff, s.count_diff) for s in api if s.size_diff or s.count_diff]
    assert [(s["size_diff"], s["count_diff"]) for s in doc["stats"]] == changed


def test_diff_shrinking_shows_minus(snaps):
    result = cli("diff", snaps["new"], snaps["old"], "--limit", "1", "--no-source")
    assert result.returncode == 0, result.stderr
    growth = snaps["growth"]
    expected = f"{_report.format_size(-growth.size_diff, True)} (-{growth.count_diff:,} blocks)"
    assert expected in entries(result.stdout)[0]


def test_output_fits_terminal_width(snaps):
    env = clean_env(COLUMNS="50")
    for args in (
        ("stats", snaps["new"], "--full-paths"),
        ("stats", snaps["new"], "--key", "traceback", "--full-paths"),
        ("diff", snaps["old"], snaps["new"], "--full-paths"),
    ):
        result = cli(*args, env=env)
        assert result.returncode == 0, result.stderr
        assert max(len(line) for line in result.stdout.splitlines()) <= 50, result.stdout
        assert "…" in result.stdout
        if "traceback" not in args:
            assert entries(result.stdout)[0].startswith("#1: …"), result.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (("stats", "missing.snap"), "cannot read missing.snap"),
        (("stats", "garbage.snap"), "garbage.snap"),
        (("diff", "garbage.snap", "garbage.snap"), "garbage.snap"),
        (("stats", "OLD", "--key", "function"), "invalid choice: 'function'"),
        (("stats", "OLD", "--limit", "many"), "--limit"),
        (("stats", "OLD", "--key", "traceback", "--cumulative"), "--cumulative"),
        (("stats",), "required"),
        (("frobnicate",), "invalid choice"),
        ((), "a command is required"),
        (("run",), "nothing to run"),
        (("run", "-n", "0", "x.py"), "--nframe"),
        (("run", "missing.py"), "cannot run missing.py: No such file"),
        (("run", "-c"), "nothing to run"),
        (("run", "-o", "x{bad}.snap", "x.py"), "unknown placeholder {bad}"),
        (("run", "--interval", "never", "x.py"), "ALLOCTRACE_INTERVAL"),
    ],
)
def test_errors_are_one_line(snaps, tmp_path, args, needle):
    (tmp_path / "garbage.snap").write_bytes(b"this is not a snapshot\n" * 10)
    args = [snaps["old"] if arg == "OLD" else arg for arg in args]
    result = cli(*args, cwd=tmp_path)
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("alloctrace: error: ") and needle in lines[0], lines[0]


def test_directory_is_one_line(tmp_path):
    result = cli("stats", str(tmp_path))
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].count(str(tmp_path)) == 1, result.stderr


def test_tracemalloc_pickle_needs_allow_pickle(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import tracemalloc; tracemalloc.start(); x = [bytearray(700) for _ in range(70)]; "
            "tracemalloc.take_snapshot().dump('tm.pickle')",
        ],
        cwd=tmp_path,
        env=clean_env(),
        check=True,
        timeout=TIMEOUT,
    )
    refused = cli("stats", "tm.pickle", cwd=tmp_path)
    assert refused.returncode == 1
    assert len(refused.stderr.splitlines()) == 1 and "pickle" in refused.stderr
    accepted = cli("stats", "tm.pickle", "--allow-pickle", "--json", cwd=tmp_path)
    assert accepted.returncode == 0, accepted.stderr
    top = json.loads(accepted.stdout)["stats"][0]
    assert top["count"] >= 70 and top["traceback"][0]["lineno"] == 1


def test_truncated_snapshot_is_one_line(snaps, tmp_path):
    data = open(snaps["old"], "rb").read()
    (tmp_path / "cut.snap").write_bytes(data[: len(data) // 2])
    result = cli("stats", "cut.snap", cwd=tmp_path)
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1 and "cut.snap" in result.stderr


# --------------------------------------------------------------------------- run

PROGRAM = """\
import sys
print("argv", sys.argv)
print("main", __name__, __file__ if "__file__" in globals() else None)
print("stdin", sys.stdin.read().strip())
print("to stderr", file=sys.stderr)
kept = [bytearray(3000) for _ in range(300)]
sys.exit(int(sys.argv[1]))
"""


def test_run_script_behaves_as_without_the_tool(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    args = ["prog.py", "3", "-n", "--x"]
    result = cli("run", "-o", "prog.snap", *args, cwd=tmp_path, input="hi")
    plain = subprocess.run(
        [sys.executable, *args],
        cwd=tmp_path,
        env=clean_env(),
        input="hi",
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == plain.returncode == 3
    out = result.stdout.splitlines()
    assert result.stdout == plain.stdout
    assert out[0] == "argv ['prog.py', '3', '-n', '--x']"
    assert out[2] == "stdin hi"
    err = result.stderr.splitlines()
    assert err[0] == "to stderr"
    assert err[1].startswith("Top 10 lines in prog.snap (traceback_limit=1")
    assert err[2].startswith("#1: prog.py:6: ")
    assert "alloctrace: snapshot written to prog.snap; see 'alloctrace stats prog.snap'" in err
    snapshot = alloctrace.Snapshot.load(str(tmp_path / "prog.snap"))
    assert snapshot.traceback_limit == 1


def test_run_module_with_nframe_quiet_and_default_output(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tool.py").write_text(PROGRAM)
    result = cli("run", "-q", "-n", "4", "-m", "pkg.tool", "0", cwd=tmp_path, input="")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"argv [{str(package / 'tool.py')!r}, '0']"
    assert result.stdout.splitlines()[1] == f"main __main__ {package / 'tool.py'}"
    plain = subprocess.run(
        [sys.executable, "-m", "pkg.tool", "0"],
        cwd=tmp_path,
        env=clean_env(),
        input="",
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.stdout == plain.stdout
    assert result.stderr == "to stderr\n"
    # By default, a capture directory of the process tree (one process here).
    (capture,) = [f for f in os.listdir(tmp_path) if f.startswith("alloctrace-pkg.tool-")]
    dumps = [f for f in os.listdir(tmp_path / capture) if f.endswith(".snap")]
    assert len(dumps) == 1
    assert alloctrace.Snapshot.load(str(tmp_path / capture / dumps[0])).traceback_limit == 4


def test_run_command_string(tmp_path):
    # 2 MB, so that the line leads whatever the interpreter's start-up leaves traced (on 3.10
    # the table of interned strings grew by 288 KiB while a .pth file's module loaded).
    code = "import sys; kept = [bytearray(5000) for _ in range(400)]; print(sys.argv)"
    result = cli("run", "-o", "c.snap", "-c", code, "a", "-q", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "['-c', 'a', '-q']\n"
    assert "#1: <string>:1: " in result.stderr
    assert (tmp_path / "c.snap").exists()


def test_run_killed_program_passes_the_signal_on(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(
        textwrap.dedent(
            """\
            import os, signal
            kept = [bytearray(1000) for _ in range(100)]
            os.kill(os.getpid(), signal.SIGKILL)
            """
        )
    )
    result = cli("run", "-o", "k.snap", "killed.py", cwd=tmp_path)
    assert result.returncode == -signal.SIGKILL
    assert result.stderr.splitlines() == [
        "alloctrace: no snapshot was written (the program ended with signal SIGKILL)"
    ]


def test_run_console_script(tmp_path):
    script = shutil.which("alloctrace", path=os.path.dirname(sys.executable))
    assert script, "the alloctrace console script is not installed next to the interpreter"
    (tmp_path / "p.py").write_text("x = [bytearray(100) for _ in range(10)]\n")
    result = subprocess.run(
        [script, "run", "-o", "p.snap", "p.py"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    assert "alloctrace: snapshot written to p.snap" in result.stderr


# --------------------------------------------------------------------------- rendering units


@pytest.mark.parametrize(
    "size, signed, text",
    [
        (0, False, "0 B"),
        (1023, False, "1023 B"),
        (1024, False, "1.0 KiB"),
        (12_900_000, False, "12.3 MiB"),
        (5 * 1024**3, True, "+5.0 GiB"),
        (-2048, True, "-2.0 KiB"),
        (-10, False, "-10 B"),
        (0, True, "+0 B"),
    ],
)
def test_format_size(size, signed, text):
    assert _report.format_size(size, signed) == text


def test_path_shortener():
    names = [
        "/home/me/proj/app/main.py",
        "/venv/lib/python3.11/site-packages/requests/models.py",
        "/usr/lib/python3.11/json/decoder.py",
        "/usr/lib/python3.11/site-packages/x/util.py",
        "/opt/other/lib/python3.12/site-packages/x/util.py",
        "<frozen importlib._bootstrap>",
        "/elsewhere/file.py",
    ]
    short = _report.PathShortener(names, cwd="/home/me/proj")
    assert short(names[0]) == "app/main.py"
    assert short(names[1]) == "requests/models.py"
    assert short(names[2]) == "json/decoder.py"
    # Two files would both become x/util.py: both keep their full names.
    assert short(names[3]) == names[3]
    assert short(names[4]) == names[4]
    assert short(names[5]) == names[5]
    assert short(names[6]) == names[6]
    assert _report.PathShortener(names, cwd="/home/me/proj", enabled=False)(names[0]) == names[0]
