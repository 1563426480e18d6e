"""The tracer's own memory at 25 frames on a real, deep workload (sympy from PyPI).

Each mode runs in a fresh child: no tracing, ``tracemalloc.start(25)``, ``alloctrace.start(25)``.
The child imports sympy, starts tracing, expands, series-expands, integrates and simplifies a few
expressions (stacks 25+ frames deep, hundreds of thousands of distinct tracebacks) and reports
the growth of its resident set size over the work, the tracer's own account
(``get_tracemalloc_memory()``) and the traced bytes. Modes are interleaved over rounds and the
median of each figure is printed.

The target (issue 13): alloctrace's own memory, by its account and by its RSS growth over the
untraced run, does not exceed tracemalloc's RSS growth over the untraced run.

Usage: ``python benches/deep_memory.py [--rounds N]`` (needs ``pip install sympy``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

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


def run_child(mode: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    samples: dict[str, list[dict[str, int]]] = {m: [] for m in MODES}
    for r in range(opts.rounds):
        for mode in MODES[r % len(MODES) :] + MODES[: r % len(MODES)]:
            samples[mode].append(run_child(mode))
    med = {
        m: {k: statistics.median(s[k] for s in runs) for k in runs[0]}
        for m, runs in samples.items()
    }
    base = med["none"]["rss_growth"]
    mib = 2**20
    print(f"sympy workload, {NFRAME} frames, median of {opts.rounds} interleaved rounds")
    print(
        f"{'mode':12} {'traced':>9} {'own (get_tracemalloc_memory)':>29} {'RSS growth':>11} "
        f"{'RSS over untraced':>18}"
    )
    for m in MODES:
        f = med[m]
        print(
            f"{m:12} {f['traced'] / mib:8.1f}M {f['tracer'] / mib:28.1f}M "
            f"{f['rss_growth'] / mib:10.1f}M {(f['rss_growth'] - base) / mib:17.1f}M"
        )
    limit = med["tracemalloc"]["rss_growth"] - base
    own = med["alloctrace"]["tracer"]
    over = med["alloctrace"]["rss_growth"] - base
    verdict = "met" if max(own, over) <= limit else "NOT met"
    print(
        f"target (alloctrace own and RSS over untraced <= tracemalloc RSS over untraced): {verdict}"
    )


if __name__ == "__main__":
    main()
