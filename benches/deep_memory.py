"""The tracer's own memory at 25 frames on a real, deep workload (sympy from PyPI).

Each mode runs in a fresh child: no tracing, ``tracemalloc.start(25)``, ``alloctrace.start(25)``.
The child imports sympy, starts tracing, expands, series-expands, integrates and simplifies a few
expressions (stacks 25+ frames deep, hundreds of thousands of distinct tracebacks) and reports
the growth of its resident set size over the work, the tracer's own account
(``get_tracemalloc_memory()``) and the traced bytes. Modes are interleaved over rounds and the
median of each figure is printed.

The target (issue 13): alloctrace's own memory, by its account and by its RSS growth over the
untraced run, does not exceed tracemalloc's RSS growth over the untraced run.

Usage: ``python benches/run.py --only deep_memory`` (one section per interpreter; sympy is
installed into the benchmark venv on first use) or ``python benches/deep_memory.py [--rounds N]``
(the running interpreter, which needs sympy and alloctrace).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import childproc

NFRAME = 25
MODES = ["none", "tracemalloc", "alloctrace"]

CHILD = """
import json, os, sys
mode = sys.argv[1]
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
import sympy
from sympy import cos, expand, integrate, series, simplify, sin, symbols
x, y = symbols("x y")
mod = None if mode == "none" else __import__(mode)
before = rss()
if mod:
    mod.start(NFRAME)
keep = []
for k in range(3):
    keep.append(expand((x + y + 1) ** (12 + k)))
    keep.append(series(sin(x) * cos(x), x, 0, 14 + k))
    keep.append(integrate(x**k * sin(x), x))
    keep.append(simplify(sin(x) ** 2 + cos(x) ** 2 + k))
print(json.dumps({
    "rss_growth": rss() - before,
    "tracer": mod.get_tracemalloc_memory() if mod else 0,
    "traced": mod.get_traced_memory()[0] if mod else 0,
}))
""".replace("NFRAME", str(NFRAME))


@dataclass(frozen=True)
class Settings:
    """Interleaved rounds of the three children."""

    rounds: int


PRESETS = {"full": Settings(rounds=3), "quick": Settings(rounds=1), "smoke": Settings(rounds=1)}


def run_child(python: str, mode: str) -> dict[str, int]:
    out = subprocess.run([python, "-c", CHILD, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _ensure_sympy(python: str) -> None:
    """The workload's package: installed into the benchmark venv on first use (not by tests)."""
    if subprocess.run([python, "-c", "import sympy"], capture_output=True).returncode != 0:
        subprocess.run([python, "-m", "pip", "install", "-q", "sympy"], check=True)


def run(python: str, settings: Settings, with_alloctrace: bool) -> dict[str, Any]:
    """Parent side (``benches/run.py --only deep_memory``): medians of each mode's figures."""
    _ensure_sympy(python)
    modes = MODES if with_alloctrace else MODES[:2]
    samples: dict[str, list[dict[str, int]]] = {m: [] for m in modes}
    errors: dict[str, str] = {}
    for r in range(settings.rounds):
        for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
            childproc.progress(f"[deep_memory] round {r + 1}/{settings.rounds} {mode}")
            try:
                samples[mode].append(run_child(python, mode))
            except subprocess.CalledProcessError as exc:
                errors[mode] = (exc.stderr or "").strip()
    med = {
        m: {k: statistics.median(s[k] for s in runs) for k in runs[0]}
        for m, runs in samples.items()
        if runs
    }
    return {"rounds": settings.rounds, "medians": med, "errors": errors}


def table(part: dict[str, Any]) -> list[str]:
    """The figures as text lines, and the verdict on issue 13's target."""
    med = part["medians"]
    if "none" not in med:
        return ["untraced run failed: " + part["errors"].get("none", "")[-300:]]
    base = med["none"]["rss_growth"]
    mib = 2**20
    lines = [
        f"sympy workload, {NFRAME} frames, median of {part['rounds']} interleaved round(s)",
        "",
        "| mode | traced | own (get_tracemalloc_memory) | RSS growth | RSS over untraced |",
        "|---|---|---|---|---|",
    ]
    for m, f in med.items():
        lines.append(
            f"| {m} | {f['traced'] / mib:.1f} MiB | {f['tracer'] / mib:.1f} MiB | "
            f"{f['rss_growth'] / mib:.1f} MiB | {(f['rss_growth'] - base) / mib:.1f} MiB |"
        )
    if "tracemalloc" in med and "alloctrace" in med:
        limit = med["tracemalloc"]["rss_growth"] - base
        own = med["alloctrace"]["tracer"]
        over = med["alloctrace"]["rss_growth"] - base
        verdict = "PASS" if max(own, over) <= limit else "**MISS**"
        lines += [
            "",
            "Target (issue 13): alloctrace's own memory and its RSS over untraced ≤ "
            f"tracemalloc's RSS over untraced: {verdict}",
        ]
    for mode, message in part["errors"].items():
        lines.append(f"- {mode} failed: {message.splitlines()[-1] if message else ''}")
    return lines


def render(facts: dict[str, Any], part: dict[str, Any]) -> str:
    """The markdown section of one interpreter for ``benches/run.py``."""
    interp = facts["interpreter"]
    head = [
        f"### Tracer memory at 25 frames on a real workload: {interp['python']}",
        "",
        f"- Command: `{facts['command']}`; alloctrace {interp['alloctrace']} from commit "
        f"{facts['commit']}; {facts['date']}",
        "",
    ]
    return "\n".join(head + table(part)) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    part = run(sys.executable, Settings(rounds=opts.rounds), True)
    print("\n".join(table(part)))


if __name__ == "__main__":
    main()
