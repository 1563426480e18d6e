"""Keeps the benchmark suite (benches/) from rotting: runs it end to end on tiny inputs.

The suite is not part of the project's pass/fail on performance (a MISS is a finding), but it
must keep working: every part's children start, trace, and report.  The smoke preset does that
in seconds against the interpreter running the tests, with the installed alloctrace.
"""

from __future__ import annotations

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


def _run(args: list[str], extra_path: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [extra_path, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(RUN), *args],
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
    # and one more row for alloctrace's sampled mode when alloctrace is installed.
    for name in ("deepcopy", "deepcopy_memo", "deepcopy_reduce", "json_loads"):
        expected = 3 if have_alloctrace else 2
        assert sum(f"| overhead | {name} (untraced" in line for line in rows) == expected, table
    if have_alloctrace:
        sampled = [line for line in rows if "sampled | 64, sampled 512 KiB" in line]
        assert len(sampled) == 1 and "slowdown ≤1.05x" in sampled[0], table
        assert sampled[0].split(" | ")[4].endswith("x"), table
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
