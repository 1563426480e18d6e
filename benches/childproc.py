"""Running one measurement in a fresh child process and collecting its JSON answer.

Every timing in the suite is taken in a child process started just for it, so a tracer started
for one mode can never leak into the next, and the parent can interleave modes (untraced,
tracemalloc, alloctrace) run by run to spread the noise of a shared machine evenly over them.
The child writes its answer as JSON to a file named on its command line rather than to stdout,
because the benchmarked programs are free to print.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent

#: Environment variables that would switch a tracer on behind the harness's back.
_TRACING_ENV = ("PYTHONTRACEMALLOC", "PYTHONDEVMODE", "PYTHONMALLOC")


class ChildFailed(RuntimeError):
    """A benchmark child process exited with an error; the message carries its stderr."""


def child_env() -> dict[str, str]:
    """Return the environment for a child: ours, minus anything that turns tracing on."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _TRACING_ENV and not k.startswith("ALLOCTRACE")
    }
    env["PYTHONHASHSEED"] = "0"
    return env


def run_child(python: str, part: str, args: Sequence[str], timeout: float = 1800) -> Any:
    """Run ``python benches/child.py PART ARGS --result FILE`` and return the decoded JSON."""
    fd, result = tempfile.mkstemp(prefix="alloctrace-bench-", suffix=".json")
    os.close(fd)
    cmd = [python, str(BENCH_DIR / "child.py"), part, *args, "--result", result]
    try:
        proc = subprocess.run(
            cmd,
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
            raise ChildFailed(f"{' '.join(cmd)} exited with {proc.returncode}:\n{tail}")
        text = Path(result).read_text()
        if not text:
            raise ChildFailed(f"{' '.join(cmd)} wrote no result")
        return json.loads(text)
    finally:
        os.unlink(result)


def write_result(path: str, value: Any) -> None:
    """Child side: store the answer where the parent will look for it."""
    Path(path).write_text(json.dumps(value))


def rotated(items: Sequence[Any], round_index: int) -> list[Any]:
    """Return *items* rotated by *round_index*, so no mode always runs first (or last)."""
    if not items:
        return []
    shift = round_index % len(items)
    return list(items[shift:]) + list(items[:shift])


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence (the suite's estimator: robust to a noisy neighbour)."""
    return statistics.median(values)


def ratio_table(
    times: dict[str, list[float]], base: str, width: int = 18, rounds: bool = False
) -> list[str]:
    """The lines of a table of each mode's median wall time and its ratio to *base*'s median
    (modes in *times*' order); with *rounds*, each round's time too."""
    reference = median(times[base])
    lines = [
        f"{'mode':<{width}} {'median s':>9} {'vs ' + base:>14}" + ("  rounds" if rounds else "")
    ]
    for mode, values in times.items():
        middle = median(values)
        line = f"{mode:<{width}} {middle:>9.3f} {middle / reference:>13.3f}x"
        if rounds:
            line += "  " + " ".join(f"{v:.2f}" for v in values)
        lines.append(line)
    return lines


def geomean(values: Sequence[float]) -> float:
    """Geometric mean of positive ratios."""
    return statistics.geometric_mean(values)


_STARTED = time.monotonic()


def memray_available(python: str) -> bool:
    """True when *python* can import memray (the benches install it; tests do not)."""
    probe = subprocess.run([python, "-c", "import memray"], capture_output=True)
    return probe.returncode == 0


def progress(message: str) -> None:
    """Progress goes to stderr so stdout carries nothing but the markdown report."""
    elapsed = int(time.monotonic() - _STARTED)
    print(f"{elapsed // 60:3d}:{elapsed % 60:02d} {message}", file=sys.stderr, flush=True)
