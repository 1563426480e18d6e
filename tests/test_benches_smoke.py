"""Keeps the benchmark suite (benches/) from rotting: runs it end to end on tiny inputs.

The suite is not part of the project's pass/fail on performance (a MISS is a finding), but it
must keep working: every part's children start, trace, and report.  The smoke preset does that
in seconds against the interpreter running the tests, with the installed alloctrace.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parent.parent / "benches" / "run.py"


@pytest.fixture(scope="module")
def pyperformance_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PYTHONPATH entry under which pyperformance imports (empty if already installed)."""
    if importlib.util.find_spec("pyperformance") is not None:
        return ""
    target = tmp_path_factory.mktemp("pyperformance")
    try:
        pip = [sys.executable, "-m", "pip", "install", "-q", "--target", str(target)]
        proc = subprocess.run(
            [*pip, "pyperformance"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"pyperformance is not installable here: {exc}")
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        pytest.skip(f"pyperformance is not installable here: pip said {tail[0]}")
    return str(target)


def _run(
    args: list[str], extra_path: str = "", script: Path = RUN
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [extra_path, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_smoke_run_reports_every_part(pyperformance_path: str, tmp_path: Path) -> None:
    out = tmp_path / "results.md"
    proc = _run(["--smoke", "--python", "current", "--out", str(out)], pyperformance_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout
    assert out.read_text() == table
    assert "Failures" not in table, table
    assert "| part | case | nframe | tracemalloc | alloctrace |" in table
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    parts = {line.split(" | ")[0].strip("| ") for line in rows}
    assert parts == {"overhead", "hook", "memory", "snapshot", "objects"}
    have_alloctrace = importlib.util.find_spec("alloctrace") is not None
    # Every benchmark in the smoke preset got a slowdown under tracemalloc at both depths,
    # and two more rows for alloctrace's sampled mode (with and without re-attribution of
    # reused objects) when alloctrace is installed.
    for name in ("deepcopy", "deepcopy_memo", "deepcopy_reduce", "json_loads"):
        expected = 4 if have_alloctrace else 2
        assert sum(f"| overhead | {name} (untraced" in line for line in rows) == expected, table
    if have_alloctrace:
        sampled = [line for line in rows if "sampled | 64, sampled 512 KiB" in line]
        assert len(sampled) == 2, table
        assert "reattribute=False" not in sampled[0], table
        assert "64, sampled 512 KiB, reattribute=False |" in sampled[1], table
        for line in sampled:
            assert "slowdown ≤1.05x" in line and line.split(" | ")[4].endswith("x"), table
        # alloctrace is installed, so its column must hold figures, not the absent marker.
        assert "alloctrace column absent" not in table
        overhead_rows = [line for line in rows if line.startswith("| overhead | json_loads")]
        assert all(line.split(" | ")[4].endswith("x") for line in overhead_rows), table


def test_unknown_part_is_rejected() -> None:
    proc = _run(["--only", "overhead,bogus", "--python", "current"])
    assert proc.returncode == 2
    assert "unknown part(s) in --only: bogus" in proc.stderr


def test_unsupported_python_is_rejected() -> None:
    proc = _run(["--python", "2.7"])
    assert proc.returncode != 0
    assert "unsupported --python '2.7'" in proc.stderr


def test_rounds_below_one_are_rejected() -> None:
    proc = _run(["--only", "overhead", "--rounds", "0", "--python", "current"])
    assert proc.returncode == 2
    assert "--rounds must be at least 1, not 0" in proc.stderr


def test_unknown_benchmark_is_rejected() -> None:
    proc = _run(["--only", "instructions", "--benchmarks", "float,nosuch", "--python", "current"])
    assert proc.returncode == 2
    assert "unknown benchmark(s) in --benchmarks: nosuch" in proc.stderr


def _bench_module(name: str):  # noqa: ANN202 - a module loaded from benches/
    sys.path.insert(0, str(RUN.parent))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(RUN.parent))


def test_instruction_table_reports_ratios_and_targets(tmp_path: Path) -> None:
    """The instructions part (run under valgrind, too slow for the suite) renders its counts as
    ratios to the untraced count of the same loops, with geomeans and issue 20's targets."""
    instructions = _bench_module("instructions")
    dump = tmp_path / "cg.out.1"
    dump.write_text("events: Ir\nfl=x\nfn=y\n1 5\nsummary: 123456\n")
    assert instructions._instructions(dump) == 123456
    assert [instructions._power_of_two_floor(n) for n in (1, 3, 4, 1000)] == [1, 2, 4, 512]
    part = {
        "modes": ["none", "tracemalloc:1", "alloctrace:1", "alloctrace:25", "memray"],
        "min_time": 0.02,
        "memray": True,
        "errors": {},
        "rows": [
            {
                "workload": "a",
                "loops": 8,
                "instructions": {
                    "none": 100e6,
                    "tracemalloc:1": 500e6,
                    "alloctrace:1": 120e6,
                    "alloctrace:25": 150e6,
                    "memray": 300e6,
                },
            },
            {
                "workload": "b",
                "loops": 2,
                "instructions": {
                    "none": 200e6,
                    "tracemalloc:1": 400e6,
                    "alloctrace:1": 500e6,
                    "alloctrace:25": 600e6,
                    "memray": 200e6,
                },
            },
        ],
    }
    facts = {
        "command": "python benches/run.py --only instructions",
        "commit": "abc1234",
        "date": "2026-11-23 22:00 UTC",
        "wall": "1.0 min",
        "machine": {"cpu": "cpu", "cores": "2"},
        "interpreter": {
            "python": "CPython 3.11.7",
            "executable": "python",
            "pyperformance": "1.14.0",
            "alloctrace": "0.1.0",
        },
    }
    text = instructions.render(facts, part)
    assert "not time" in text
    assert "| a | 8 | 100.0 | 5.00x | 1.20x | 1.50x | 3.00x |" in text
    assert "| b | 2 | 200.0 | 2.00x | 2.50x | 3.00x | 1.00x |" in text
    # geomean of 1.2 and 2.5 at nframe 1 is 1.73x: above the 1.3x target.
    assert "| **geometric mean** of 2 | | | **3.16x** | **1.73x** | **2.12x** | **1.73x** |" in text
    assert "geomean at nframe 1 ≤1.3x: 1.73x **MISS**" in text
    assert "worst b 2.50x **MISS**" in text
    # Row a: tracemalloc's overhead 4.0 against 0.2 (20x less, fine); row b: 1.0 against 1.5.
    assert "on the 2 rows where tracemalloc costs ≥1.5x: **MISS**: b (0.7x)" in text
    part.update(memray=False, memray_absent="left out (--no-memray)")
    part["modes"].remove("memray")
    assert "- memray columns absent: left out (--no-memray)" in instructions.render(facts, part)


def test_deep_memory_table_checks_issue_13_target() -> None:
    sys.path.insert(0, str(RUN.parent))
    try:
        import deep_memory
    finally:
        sys.path.remove(str(RUN.parent))
    mib = 2**20

    def figures(rss: int, own: int) -> dict[str, int]:
        return {"rss_growth": rss * mib, "tracer": own * mib, "traced": 12 * mib}

    part = {
        "rounds": 1,
        "errors": {},
        "medians": {
            "none": figures(100, 0),
            "tracemalloc": figures(160, 30),
            "alloctrace": figures(150, 40),
        },
    }
    text = "\n".join(deep_memory.table(part))
    assert "| alloctrace | 12.0 MiB | 40.0 MiB | 150.0 MiB | 50.0 MiB |" in text
    assert text.endswith("tracemalloc's RSS over untraced: PASS")
    part["medians"]["alloctrace"] = figures(150, 61)  # own memory above tracemalloc's 60 MiB
    assert "\n".join(deep_memory.table(part)).endswith("**MISS**")


def _bench_module(name: str):  # noqa: ANN202 - a module loaded from benches/
    sys.path.insert(0, str(RUN.parent))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(RUN.parent))


@pytest.mark.parametrize(
    ("spec", "parsed", "native", "interval"),
    [
        ("alloctrace:1+native", ("alloctrace", 1), True, None),
        ("alloctrace:64@524288", ("alloctrace", 64), False, 524288),
        ("memray", ("memray", 0), False, None),
        ("memray+python-allocators", ("memray", 0), False, None),
        ("memray+native", ("memray", 0), False, None),
        ("tracemalloc:25", ("tracemalloc", 25), False, None),
    ],
)
def test_mode_strings(spec: str, parsed: tuple, native: bool, interval: int | None) -> None:
    tracers = _bench_module("tracers")
    assert tracers.parse(spec) == parsed
    assert tracers.is_native(spec) is native
    assert tracers.sample_interval(spec) == interval


@pytest.mark.parametrize(
    "spec", ["tracemalloc:1+native", "memray+", "memray+bogus", "memray:1", "alloctrace:1+x"]
)
def test_bad_mode_strings_are_rejected(spec: str) -> None:
    with pytest.raises(ValueError, match="bad"):
        _bench_module("tracers").parse(spec)


def test_side_by_side_table_reports_geomeans_and_native_target() -> None:
    report = _bench_module("report")
    modes = ["none", "tracemalloc:1", "alloctrace:1", "alloctrace:1+native", "memray+native"]
    seconds = [
        {"none": 1.0, "tracemalloc:1": 4.0, "alloctrace:1": 1.2, "alloctrace:1+native": 1.5,
         "memray+native": 3.0},
        {"none": 2.0, "tracemalloc:1": 2.0, "alloctrace:1": 2.4, "alloctrace:1+native": 4.0,
         "memray+native": 8.0},
        # A child that failed: left out of every mean.
        {"none": 1.0, "tracemalloc:1": 9.0, "alloctrace:1": 9.0},
    ]  # fmt: skip
    part = {
        "modes": modes,
        "extra": ["alloctrace:1+native", "memray+native"],
        "extra_absent": ["memray"],
        "rows": [{"workload": f"w{i}", "seconds": s} for i, s in enumerate(seconds)],
    }
    lines = report.side_by_side(part)
    text = "\n".join(lines)
    assert "| benchmark | untraced | tracemalloc 1 | alloctrace 1 | alloctrace 1, native | " in text
    assert "| w2 | 1 s | 9.00x | 9.00x | failed | failed |" in text
    # Means over w0 and w1: sqrt(4 * 1) = 2, sqrt(1.2 * 1.2) = 1.2, sqrt(1.5 * 2), sqrt(3 * 4).
    assert "| **geometric mean** of 2 |  | **2.00x** | **1.20x** | **1.73x** | **3.46x** |" in text
    assert "memray: not measured" in text
    assert "Native mode: geometric mean 1.73x, target ≤1.6x: **MISS**" in text
    assert report.side_by_side({**part, "extra": []}) == []


def test_side_by_side_states_what_reattribution_costs() -> None:
    report = _bench_module("report")
    modes = ["none", "tracemalloc:1", "alloctrace:1", "alloctrace:1+noreattribute"]
    seconds = [
        {"none": 1.0, "tracemalloc:1": 4.0, "alloctrace:1": 2.5, "alloctrace:1+noreattribute": 1.1},
        {"none": 1.0, "tracemalloc:1": 2.0, "alloctrace:1": 1.6, "alloctrace:1+noreattribute": 1.1},
    ]  # fmt: skip
    part = {
        "modes": modes,
        "extra": ["alloctrace:1+noreattribute"],
        "rows": [{"workload": f"w{i}", "seconds": s} for i, s in enumerate(seconds)],
    }
    text = "\n".join(report.side_by_side(part))
    assert "| alloctrace 1 | alloctrace 1, reattribute=False |" in text, text
    # sqrt(2.5 * 1.6) = 2.0 with one row over 2x; sqrt(1.1 * 1.1) = 1.1 with none.
    assert (
        "with it (the default) 2.00x (**MISS** against ≤1.3x), 1 row over 2x; "
        "without it (`reattribute=False`) 1.10x (PASS against ≤1.3x), 0 rows over 2x"
    ) in text, text


def test_round_spread_gives_each_rounds_own_geomean() -> None:
    report = _bench_module("report")
    sampled = "alloctrace:64@524288"
    rows = [
        # The third round of w1 failed under alloctrace:1; w1 has no sampled figure at all.
        {"none": [1.0, 1.0, 1.0], "alloctrace:1": [1.2, 1.5, 1.0], sampled: [1.0, 1.1, 1.05]},
        {"none": [2.0, 2.0, 2.0], "alloctrace:1": [2.4, 2.0, None]},
    ]  # fmt: skip
    part = {
        "nframes": [1],
        "sampled": [[64, 524288, True]],
        "settings": {"rounds": 3},
        "rows": [
            {
                "workload": f"w{i}",
                "seconds": {k: max(v for v in vs if v) for k, vs in r.items()},
                "per_round": r,
                "lower_bound": [sampled],
            }
            for i, r in enumerate(rows)
        ],
    }
    text = "\n".join(report.round_spread(part))
    # sqrt(1.2 * 1.2), sqrt(1.5 * 1.0); round 3 lacks w1, so it has no mean over both.
    assert "of each of the 3 rounds alone" in text, text
    assert "nframe 1: 1.20x, 1.22x, —; " in text, text
    assert "64, sampled 512 KiB: ≥1.00x, ≥1.10x, ≥1.05x" in text, text
    assert report.round_spread({**part, "settings": {"rounds": 1}}) == []
    # Results written before rounds were kept apart.
    old = [{k: v for k, v in row.items() if k != "per_round"} for row in part["rows"]]
    assert report.round_spread({**part, "rows": old}) == []


def test_native_side_by_side_smoke(pyperformance_path: str) -> None:
    """--native, --memray and --fidelity-cost: the native and reattribute=False columns are
    measured; memray's are measured or named as absent (the tests do not install memray)."""
    proc = _run(
        [
            "--smoke",
            "--python",
            "current",
            "--only",
            "overhead",
            "--native",
            "--memray",
            "--fidelity-cost",
        ],
        pyperformance_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout
    if importlib.util.find_spec("alloctrace") is None:
        pytest.skip("alloctrace is not installed")
    assert "| alloctrace 1, native | alloctrace 1, reattribute=False |" in table, table
    assert "- Re-attribution of objects reused from free lists, over the " in table, table
    row = next(line for line in table.splitlines() if line.startswith("| json_loads | "))
    cells = row.strip("| ").split(" | ")
    assert cells[4].endswith("x"), row
    have_memray = importlib.util.find_spec("memray") is not None
    assert ("memray --native: not measured" in table) is not have_memray, table


FIDELITY = RUN.parent / "fidelity.py"


def test_fidelity_report_lists_each_disagreement() -> None:
    fidelity = _bench_module("fidelity")
    theirs = {"a.py:1 56 B, 3 frames": 2, "tracemalloc.py:558 56 B, 3 frames": 1}
    ours = {"a.py:1 56 B, 3 frames": 3, "b.py:9 32 B, 1 frames": 4}
    assert fidelity.differences(theirs, ours) == {
        "a.py:1 56 B, 3 frames": (2, 3),
        "b.py:9 32 B, 1 frames": (0, 4),
        "tracemalloc.py:558 56 B, 3 frames": (1, 0),
    }
    lines = fidelity.row("bench", theirs, ours, show=2)
    assert lines[0].split() == [
        "bench",
        "tracemalloc",
        "3",
        "alloctrace",
        "7",
        "keys",
        "differing",
        "3",
    ]
    assert lines[1:] == [
        "    a.py:1 56 B, 3 frames: 2 / 3",
        "    b.py:9 32 B, 1 frames: 0 / 4",
        "    ... 1 more",
    ]
    assert fidelity.row("same", ours, ours, show=2)[1:] == []


def test_fidelity_runs_both_tracers(pyperformance_path: str) -> None:
    """Two small benchmarks under each tracer, keyed by whole tracebacks of three frames: every
    row has both totals (the figures are findings, not checked here)."""
    if importlib.util.find_spec("alloctrace") is None:
        pytest.skip("alloctrace is not installed")
    proc = _run(
        ["--only", "json_loads,richards", "--nframe", "3", "--whole"],
        pyperformance_path,
        FIDELITY,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if not line.startswith(" ")]
    assert [r[0] for r in rows] == ["richards", "json_loads"], proc.stdout
    for r in rows:
        assert r[1] == "tracemalloc" and r[3] == "alloctrace" and int(r[2]) > 0, proc.stdout


def test_fidelity_rejects_bad_arguments() -> None:
    proc = _run(["--only", "float,nosuch"], script=FIDELITY)
    assert proc.returncode == 2 and "unknown benchmark(s): nosuch" in proc.stderr
    proc = _run(["--nframe", "0"], script=FIDELITY)
    assert proc.returncode == 2 and "--nframe must be in 1..65535, not 0" in proc.stderr


def test_python_path_must_be_a_supported_interpreter(tmp_path: Path) -> None:
    missing = tmp_path / "python3.11"
    proc = _run(["--python", str(missing)])
    assert proc.returncode != 0
    assert f"--python {missing}: not an executable file" in proc.stderr
    proc = _run(["--python", "/bin/true"])
    assert proc.returncode != 0
    assert "--python /bin/true: not a CPython 3.9-3.13 interpreter (does not run" in proc.stderr


def test_python_path_gets_a_venv_of_its_own() -> None:
    """Two builds of one version (pyenv's, a distribution's) must not share a venv."""
    environments = _bench_module("environments")
    assert environments.venv_name("3.11") == "venv-3.11"
    name = environments.venv_name(sys.executable)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert name.startswith(f"venv-{version}-")
    assert os.path.realpath(sys.executable).split(os.sep)[-1] in name
    assert "/" not in name
