"""Live traces compared with tracemalloc's, trace by trace, on the pyperformance benchmarks.

Usage::

    python benches/fidelity.py [--python PY] [--nframe 1] [--whole] [--only float,go] [--no-aslr]

Each benchmark runs in two fresh children of PY (which must have pyperformance and alloctrace
installed, as the venvs ``benches/run.py`` makes under ``~/.cache/alloctrace-bench`` do), one
per tracer.  A child imports both tracers (so that the heap is laid out alike before tracing
starts), runs each of the script's workloads once untraced, collects garbage, starts its tracer
at ``--nframe`` frames, runs each workload once more, clears CPython's type attribute cache
and takes a snapshot.  It reports its live traces counted by (file, line, size,
``total_nframe``) of the most recent frame, or with ``--whole`` by every frame of the traceback
(file and line of each, most recent first); the parent prints, per benchmark, both totals and
every such key on which the two disagree.  This is a check of answers, not of speed: an exact
per-trace match is the goal, and each difference found is either explained in
docs/tracemalloc-compatibility.md or a bug.

Differences that are not alloctrace's:

* ``tracemalloc.py`` lines: the standard module's ``take_snapshot()`` runs Python code while it
  traces, and may take a tuple off a free list (re-attributing it to itself) or allocate one;
  the other tracer then has that tuple where it was made last, usually one count more on one
  key of 56 bytes.
* Programs whose state depends on addresses (a cache keyed by an object's address keeps
  different objects alive); ``--no-aslr`` runs the children under ``setarch -R`` so that each
  tracer at least repeats itself.  CPython's own such cache, the type attribute cache (which
  keeps the attribute names it last looked up alive), is cleared before the snapshot.
* Programs that differ from run to run under either tracer (time, random numbers, threads):
  run them twice under tracemalloc to see how much.
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRACERS = ("tracemalloc", "alloctrace")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benches/fidelity.py", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--python", default=sys.executable, help="interpreter to run")
    parser.add_argument("--nframe", type=int, default=1, help="frames per traceback")
    parser.add_argument("--only", help="comma-separated benchmark names (default: all)")
    parser.add_argument(
        "--no-aslr", action="store_true", help="run the children under `setarch -R`"
    )
    parser.add_argument("--whole", action="store_true", help="key traces by their whole traceback")
    parser.add_argument("--show", type=int, default=8, help="differing keys shown per row")
    args = parser.parse_args(argv)
    if not 1 <= args.nframe <= 65535:
        parser.error(f"--nframe must be in 1..65535, not {args.nframe}")
    if args.no_aslr and shutil.which("setarch") is None:
        parser.error("--no-aslr needs setarch (util-linux), which is not on PATH")
    return args


def differences(theirs: dict[str, int], ours: dict[str, int]) -> dict[str, tuple[int, int]]:
    """``{key: (tracemalloc's count, alloctrace's count)}`` for every key they disagree on."""
    return {
        key: (theirs.get(key, 0), ours.get(key, 0))
        for key in sorted(theirs.keys() | ours.keys())
        if theirs.get(key, 0) != ours.get(key, 0)
    }


def row(name: str, theirs: dict[str, int], ours: dict[str, int], show: int) -> list[str]:
    """The report's lines for one benchmark."""
    diff = differences(theirs, ours)
    lines = [
        f"{name:28s} tracemalloc {sum(theirs.values()):7d}  alloctrace {sum(ours.values()):7d}"
        f"  keys differing {len(diff)}"
    ]
    for key, (a, b) in list(diff.items())[:show]:
        lines.append(f"    {key}: {a} / {b}")
    if len(diff) > show:
        lines.append(f"    ... {len(diff) - show} more")
    return lines


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(HERE))
    import overhead

    wanted = set(args.only.split(",")) if args.only else None
    known = {b.name for b in overhead.BENCHMARKS}
    if wanted and wanted - known:
        print(f"unknown benchmark(s): {', '.join(sorted(wanted - known))}", file=sys.stderr)
        return 2
    prefix = ["setarch", "-R"] if args.no_aslr else []
    failed = False
    for bench in overhead.BENCHMARKS:
        if wanted and bench.name not in wanted:
            continue
        counts = []
        for tracer in TRACERS:
            command = [
                *prefix,
                args.python,
                str(HERE / "child.py"),
                "fidelity",
                tracer,
                bench.directory,
                json.dumps(list(bench.argv)),
                ",".join(bench.fresh_modules),
                str(args.nframe),
                "whole" if args.whole else "top",
            ]
            env = {**os.environ, "PYTHONHASHSEED": "0"}
            proc = subprocess.run(command, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
                print(f"{bench.name:28s} {tracer} failed: {tail[0]}", flush=True)
                failed = True
                break
            counts.append(json.loads(proc.stdout))
        else:
            print("\n".join(row(bench.name, counts[0], counts[1], args.show)), flush=True)
    return 1 if failed else 0


def _short(filename: str) -> str:
    """A file's name, with its directory for a benchmark (every script is run_benchmark.py)."""
    where = Path(filename)
    return f"{where.parent.name}/{where.name}" if where.name == "run_benchmark.py" else where.name


def child_main(argv: list[str]) -> None:
    """Child side: one benchmark under one tracer; prints the live traces' counts as JSON.
    Both tracers are imported whichever runs, so that the heap is laid out alike before it
    starts (importing only one moved a few objects, and what an address-keyed cache kept)."""
    import tracemalloc  # noqa: F401

    import overhead

    import alloctrace  # noqa: F401

    tracer, directory, script_argv, fresh, nframe, key = argv
    module = importlib.import_module(tracer)
    workloads = overhead.load_workloads(overhead._script(directory), script_argv, fresh)
    for workload in workloads:
        workload.seconds_per_op(1)
    gc.collect()
    module.start(int(nframe))
    for workload in workloads:
        workload.seconds_per_op(1)
    # CPython's type attribute cache keeps the attribute names it last saw alive, in slots
    # chosen by their addresses, which the tracers' own memory moves: not the program's state.
    sys._clear_type_cache()
    snapshot = module.take_snapshot()
    module.stop()
    counts: collections.Counter[str] = collections.Counter()
    harness = str(HERE)
    for trace in snapshot.traces:
        # A Traceback runs from the outermost frame to the most recent one.
        frames = list(reversed(trace.traceback))
        if frames[0].filename.startswith(harness):
            continue
        shown = frames if key == "whole" else frames[:1]
        where = " < ".join(f"{_short(f.filename)}:{f.lineno}" for f in shown)
        counts[f"{where} {trace.size} B, {trace.traceback.total_nframe} frames"] += 1
    json.dump(counts, sys.stdout)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
