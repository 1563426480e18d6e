"""Native mode's cost: two workloads run whole (start-up and imports included) untraced, under
``tracemalloc``, ``alloctrace``, ``alloctrace --native`` and ``memray run --native``, in one run.

Usage::

    python benches/native.py [--rounds 5] [--scale 1.0] [--callgrind] [--out results.md]

*python* is the interpreter measured: it needs alloctrace, numpy and memray installed
(``pip install -r benches/requirements-native.txt`` and the alloctrace wheel). Each round runs
every mode once, in turn (interleaved, so a busy machine slows all modes alike); the figure is
the least CPU time (user + system, of the child and its threads) over the rounds, and ratios
are against untraced and against tracemalloc. With ``--callgrind`` each mode instead runs once
under ``valgrind --tool=callgrind`` and the figure is its instruction count (exact from run to
run; ``--scale`` 0.05 keeps that to minutes). The table goes to stdout (and ``--out``).

Workloads: ``numpy`` (arrays made, combined, sorted and reduced, a small matrix product; numpy's
data comes from ``malloc``, which native mode redirects) and ``python`` (dicts, lists and strings
only: native mode redirects nothing there but the extension modules' own calls).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NUMPY = """
import numpy as np
rng = np.random.default_rng(1)
keep = []
for i in range(int(2000 * SCALE)):
    a = rng.random((64, 64))
    b = a @ a.T
    c = np.sort(a, axis=0) + np.arange(64)
    keep.append(c[:, :4].copy())
    small = [np.arange(k) * 2 for k in range(1, 40)]
    total = b.sum() + sum(s.sum() for s in small)
    if len(keep) > 200:
        keep.clear()
"""

PYTHON = """
import json
keep = []
for i in range(int(20000 * SCALE)):
    record = {"id": i, "name": "user%d" % i, "tags": [str(t) for t in range(i % 20)]}
    text = json.dumps(record)
    back = json.loads(text)
    keep.append((back["name"].upper(), tuple(back["tags"])))
    if len(keep) > 5000:
        keep = keep[2500:]
"""

WORKLOADS = {"numpy": NUMPY, "python": PYTHON}
MODES = ("none", "tracemalloc", "alloctrace", "alloctrace --native", "memray run --native")


def command(mode: str, script: Path, out_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The child's command line and environment for *mode*, tracing one frame per block."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALLOCTRACE", "PYTHONTRACE"))}
    py = [sys.executable]
    if mode == "none":
        return [*py, str(script)], env
    if mode == "tracemalloc":
        return [*py, "-X", "tracemalloc=1", str(script)], env
    if mode == "alloctrace":
        return [*py, str(script)], {**env, "ALLOCTRACE": "1"}
    if mode == "alloctrace --native":
        return [*py, str(script)], {**env, "ALLOCTRACE": "1", "ALLOCTRACE_NATIVE": "1"}
    if mode == "memray run --native":
        capture = out_dir / "memray.bin"
        if capture.exists():
            capture.unlink()
        return [*py, "-m", "memray", "run", "--native", "-q", "-o", str(capture), str(script)], env
    raise ValueError(mode)


def cpu_seconds(cmd: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def instructions(cmd: list[str], env: dict[str, str], out_dir: Path) -> float:
    out = out_dir / "callgrind.out"
    # --smc-check=all: see instructions.py (alloctrace patches libpython's code at start()).
    grind = [
        "valgrind",
        "--tool=callgrind",
        "--smc-check=all",
        f"--callgrind-out-file={out}",
        "--trace-children=no",
    ]
    result = subprocess.run([*grind, *cmd], env=env, capture_output=True, text=True, check=True)
    for line in result.stderr.splitlines():
        if "Collected :" in line:
            return float(line.rsplit(":", 1)[1].strip())
    raise RuntimeError(f"no instruction count in callgrind's output:\n{result.stderr[-2000:]}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.callgrind and not shutil.which("valgrind"):
        parser.error("--callgrind needs valgrind on PATH")
    unit = "instructions" if args.callgrind else f"CPU seconds (least of {args.rounds} rounds)"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp)
        for name, body in WORKLOADS.items():
            script = out_dir / f"workload_{name}.py"
            script.write_text(f"SCALE = {args.scale!r}\n{body}")
            best: dict[str, float] = {}
            for round_ in range(1 if args.callgrind else args.rounds):
                for mode in MODES:
                    cmd, env = command(mode, script, out_dir)
                    value = (
                        instructions(cmd, env, out_dir) if args.callgrind else cpu_seconds(cmd, env)
                    )
                    best[mode] = min(value, best.get(mode, value))
                    print(f"{name} round {round_ + 1} {mode}: {value:.4g}", file=sys.stderr)
            for mode in MODES:
                rows.append(
                    (
                        name,
                        mode,
                        best[mode],
                        best[mode] / best["none"],
                        best[mode] / best["tracemalloc"],
                    )
                )
    version = ".".join(map(str, sys.version_info[:3]))
    lines = [
        f"Native mode, CPython {version}, scale {args.scale}, one frame; figure: {unit}",
        "",
        "| workload | mode | figure | vs untraced | vs tracemalloc |",
        "|---|---|---:|---:|---:|",
    ]
    for name, mode, value, vs_none, vs_tm in rows:
        figure = f"{value:.4g}" if not args.callgrind else f"{value / 1e6:.0f} M"
        lines.append(f"| {name} | {mode} | {figure} | {vs_none:.2f}x | {vs_tm:.2f}x |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
