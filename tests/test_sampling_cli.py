"""Sampled mode from outside the program: ``ALLOCTRACE_SAMPLE_INTERVAL`` and
``ALLOCTRACE_SAMPLE_SEED`` at start-up, ``alloctrace run --sample-interval``, and how
``stats``/``diff``/``export``/``flamegraph`` present sampled snapshots. Every case runs a fresh
interpreter, bounded in time."""

import gzip
import json
import os
import subprocess

import pytest

from alloctrace import _startup
from subproc import run_python as python

TIMEOUT = 120

PROGRAM = """\
kept = [bytes(1000) for _ in range(50_000)]
"""


def cli(*args, cwd=None, **env):
    return python(["-m", "alloctrace", *args], cwd=cwd, **env)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("524288", 524288),
        ("512KiB", 512 * 1024),
        ("512k", 512 * 1024),
        ("512 KB", 512 * 1024),
        ("2MiB", 2 << 20),
        ("2m", 2 << 20),
        ("1.5MiB", 3 << 19),
        ("1GiB", 1 << 30),
        ("0", 0),
        ("64b", 64),
        ("", None),
        ("KiB", None),
        ("-5", None),
        ("5 XB", None),
        ("1e6", None),
        ("0x100", None),
        ("inf", None),
    ],
)
def test_parse_size(text, expected):
    assert _startup.parse_size(text) == expected


PROBE = "import alloctrace; print(alloctrace.is_tracing(), alloctrace.get_sample_interval())"


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"ALLOCTRACE_SAMPLE_INTERVAL": "512KiB"}, "True 524288"),
        ({"ALLOCTRACE_SAMPLE_INTERVAL": "2MiB", "ALLOCTRACE": "5"}, "True 2097152"),
        ({"ALLOCTRACE_SAMPLE_INTERVAL": "0"}, "True None"),
        ({"ALLOCTRACE_SAMPLE_INTERVAL": "512k", "ALLOCTRACE": "0"}, "False None"),
        ({"ALLOCTRACE_SAMPLE_INTERVAL": "4096", "ALLOCTRACE_SAMPLE_SEED": "7"}, "True 4096"),
    ],
)
def test_start_up_sampling(env, expected):
    result = python(["-c", PROBE], **env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


def test_start_up_seed_reproduces_samples():
    program = (
        "import alloctrace\n"
        "kept = [bytes(1000 + i) for i in range(3000)]\n"
        "s = alloctrace.take_snapshot()\n"
        "print(sorted(t.size for t in s.traces if t.traceback[0].lineno == 2))\n"
    )
    env = {"ALLOCTRACE_SAMPLE_INTERVAL": "8KiB", "ALLOCTRACE_SAMPLE_SEED": "99"}
    runs = [python(["-c", program], **env) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert runs[0].stdout == runs[1].stdout
    assert len(eval(runs[0].stdout)) > 50
    other = python(["-c", program], **{**env, "ALLOCTRACE_SAMPLE_SEED": "100"})
    assert other.stdout != runs[0].stdout


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"ALLOCTRACE_SAMPLE_INTERVAL": "lots"}, "ALLOCTRACE_SAMPLE_INTERVAL='lots'"),
        ({"ALLOCTRACE_SAMPLE_INTERVAL": "-1"}, "ALLOCTRACE_SAMPLE_INTERVAL='-1'"),
        ({"ALLOCTRACE_SAMPLE_INTERVAL": "2TiB"}, "ALLOCTRACE_SAMPLE_INTERVAL='2TiB'"),
        ({"ALLOCTRACE_SAMPLE_INTERVAL": "512 XB"}, "512KiB"),
        ({"ALLOCTRACE_SAMPLE_SEED": "3"}, "ALLOCTRACE_SAMPLE_INTERVAL is not"),
        (
            {"ALLOCTRACE_SAMPLE_INTERVAL": "4096", "ALLOCTRACE_SAMPLE_SEED": "x"},
            "ALLOCTRACE_SAMPLE_SEED='x'",
        ),
    ],
)
def test_invalid_sampling_settings_stop_before_the_program(env, needle):
    result = python(["-c", "print('program ran')"], **env)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory):
    """A program run under ``alloctrace run --sample-interval 64KiB``, and its snapshot."""
    tmp = tmp_path_factory.mktemp("sampled")
    script = tmp / "prog.py"
    script.write_text(PROGRAM)
    result = cli(
        "run",
        "--sample-interval",
        "64KiB",
        "--sample-seed",
        "1",
        "-o",
        "out.alct",
        "prog.py",
        cwd=tmp,
    )
    return tmp, result


def test_run_sample_interval_summary_says_estimates(sampled_run):
    tmp, result = sampled_run
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[1] == "(sampled, interval 64 KiB: sizes and counts are estimates)", lines
    # The top line is the program's: ~51.6 MB in 50,000 blocks, estimated.
    top = next(line for line in lines if line.startswith("#1:"))
    assert "prog.py:1" in top


def test_stats_json_and_text_on_sampled_snapshot(sampled_run):
    tmp, _ = sampled_run
    text = cli("stats", "out.alct", "--no-source", cwd=tmp)
    assert text.returncode == 0, text.stderr
    assert "sampled, interval 64 KiB: sizes and counts are estimates" in text.stdout.splitlines()[1]
    result = cli("stats", "out.alct", "--json", cwd=tmp)
    document = json.loads(result.stdout)
    assert document["snapshot"]["sample_interval"] == 65536
    top = document["stats"][0]
    assert top["traceback"][-1]["lineno"] == 1
    exact = 50_000 * 1033
    assert abs(top["size"] - exact) <= 0.15 * exact, top
    assert abs(top["count"] - 50_000) <= 0.15 * 50_000, top
    # The diff of a sampled snapshot with itself is empty, and names it as sampled.
    diff = cli("diff", "out.alct", "out.alct", cwd=tmp)
    assert "(out.alct: sampled, interval 64 KiB: sizes and counts are estimates)" in diff.stdout


def test_exports_of_sampled_snapshot(sampled_run):
    tmp, _ = sampled_run
    exported = cli("export", "out.alct", "--format", "collapsed", "-o", "out.txt", cwd=tmp)
    assert exported.returncode == 0, exported.stderr
    folded = dict(line.rsplit(" ", 1) for line in (tmp / "out.txt").read_text().splitlines())
    program = [int(v) for k, v in folded.items() if "prog.py:1" in k]
    exact = 50_000 * 1033
    assert program and abs(sum(program) - exact) <= 0.15 * exact
    assert cli("flamegraph", "out.alct", "-o", "out.svg", cwd=tmp).returncode == 0
    assert "estimated, sampled every 64 KiB" in (tmp / "out.svg").read_text()
    exported = cli("export", "out.alct", "--format", "pprof", "-o", "out.pb.gz", cwd=tmp)
    assert exported.returncode == 0, exported.stderr

    raw = gzip.decompress((tmp / "out.pb.gz").read_bytes())
    assert b"values are estimates" in raw


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--sample-interval", "huge"], "--sample-interval 'huge' is invalid"),
        (["--sample-interval", "4096", "--sample-seed", "-1"], "--sample-seed '-1' is invalid"),
        (["--sample-seed", "4"], "--sample-seed needs --sample-interval"),
    ],
)
def test_run_rejects_bad_sampling_options(tmp_path, args, needle):
    script = tmp_path / "prog.py"
    script.write_text("print('ran')\n")
    result = cli("run", *args, "prog.py", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert sorted(os.listdir(tmp_path)) == ["prog.py"]


def test_go_tool_pprof_reads_sampled_profile(sampled_run):
    import shutil

    if shutil.which("go") is None:
        pytest.skip("go is not installed (Debian: apt-get install golang-go)")
    tmp, _ = sampled_run
    exported = cli("export", "out.alct", "--format", "pprof", "-o", "go.pb.gz", cwd=tmp)
    assert exported.returncode == 0, exported.stderr
    out = subprocess.run(
        ["go", "tool", "pprof", "-raw", str(tmp / "go.pb.gz")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, "HOME": str(tmp)},
    )
    assert out.returncode == 0, out.stderr
    assert "Period: 65536" in out.stdout
