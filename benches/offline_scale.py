"""The offline commands at scale: what exports, flamegraphs and reports cost next to ``stats``.

Their output depends only on the distinct tracebacks, so their time and memory should follow
those, not the number of traces (issue 64). For each size and traceback depth this writes one
snapshot of N live traces spread over a fixed number of distinct tracebacks (50,000 by default,
as a large service has), then times each command in a fresh process, and reports its wall time,
CPU time and peak RSS, and the ratio of its CPU time to ``stats --key traceback`` on the same
file. Last, ``report`` over a series of many small dumps (an ``ALLOCTRACE_INTERVAL`` run of a
day writes thousands): its time and peak RSS, and the size of the page.

Run by hand, with alloctrace installed in the interpreter that runs it::

    python benches/offline_scale.py           # 1M and 10M traces, 1 and 25 frames, 1,000 dumps
    python benches/offline_scale.py --quick   # 1M traces only, 200 dumps
    python benches/offline_scale.py --smoke   # seconds: 20,000 traces, 20 dumps

CPU time (user + system of the child) is the figure to compare on a busy machine; wall time is
shown beside it.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time

COMMANDS = (
    ("stats --key traceback", ["stats", "--key", "traceback"]),
    ("export --format pprof", ["export", "--format", "pprof", "-o", "{out}.pb.gz"]),
    ("export --format folded", ["export", "--format", "folded", "-o", "{out}.folded"]),
    ("flamegraph", ["flamegraph", "-o", "{out}.svg"]),
    ("flamegraph --diff", ["flamegraph", "-o", "{out}.diff.svg", "--diff", "{base}"]),
    ("report", ["report", "-o", "{out}.html"]),
)


def make_snapshot(path: str, traces: int, nframe: int, distinct: int, seed: int) -> None:
    """A snapshot file of *traces* traces over *distinct* tracebacks of *nframe* frames: outer
    frames shared in runs (as a framework's are), the innermost drawn from 20,000 lines."""
    import alloctrace

    rng = random.Random(seed)
    lines = [(f"/srv/app/pkg{i % 50}/module{i % 400}.py", 1 + i % 3000) for i in range(20_000)]
    stacks = []
    for s in range(distinct):
        outer = [lines[(s // 97 + k) % len(lines)] for k in range(max(0, nframe - 3))]
        inner = [lines[rng.randrange(len(lines))] for _ in range(min(3, nframe))]
        stacks.append((tuple(reversed(outer + inner))[:nframe], nframe))
    raw = [(0, rng.randrange(8, 512), *stacks[rng.randrange(distinct)]) for _ in range(traces)]
    alloctrace.Snapshot(raw, nframe).dump(path)


def in_child(function: str, *args) -> None:
    """Runs ``function(*args)`` of this module in a child process, so that what making the
    inputs costs stays out of this process: Linux keeps a process's peak RSS across exec, so
    the commands timed from here would report it as theirs."""
    code = f"import offline_scale as m; m.{function}(*{args!r})"
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def timed(args: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and peak RSS (KiB) of ``alloctrace ARGS`` in a new process."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "alloctrace", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    error = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"alloctrace {' '.join(args)} failed ({proc.returncode}): {error}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def one_snapshot(work: str, traces: int, nframe: int, distinct: int) -> None:
    path = os.path.join(work, f"s{traces}_{nframe}.snap")
    base = os.path.join(work, f"b{traces}_{nframe}.snap")
    started = time.perf_counter()
    in_child("make_snapshot", path, traces, nframe, distinct, 1)
    in_child("make_snapshot", base, traces, nframe, distinct, 2)
    made = time.perf_counter() - started
    print(f"\n{traces:,} traces, {nframe} frames, {distinct:,} tracebacks (made in {made:.0f} s)")
    print(f"  {'command':24} {'wall':>8} {'cpu':>8} {'cpu/stats':>10} {'peak RSS':>10}")
    reference = None
    for name, template in COMMANDS:
        args = [a.format(out=os.path.join(work, "out"), base=base) for a in template] + [path]
        wall, cpu, rss = timed(args)
        reference = reference or cpu
        print(f"  {name:24} {wall:7.2f}s {cpu:7.2f}s {cpu / reference:9.1f}x {rss / 1024:8.0f} MiB")
    for p in (path, base):
        os.unlink(p)


def make_series(directory: str, dumps: int, traces: int) -> list[str]:
    """*dumps* files of about *traces* traces each, as the interval dumps of one process whose
    heap grows slowly, five seconds apart."""
    import alloctrace

    os.makedirs(directory)
    rng = random.Random(3)
    lines = [(f"/srv/app/module{i % 300}.py", 1 + i % 2000) for i in range(5_000)]
    stacks = [(tuple(lines[rng.randrange(len(lines))] for _ in range(5)), 5) for _ in range(2_000)]
    paths = []
    for n in range(dumps):
        raw = [
            (0, rng.randrange(16, 400), *stacks[rng.randrange(len(stacks))])
            for _ in range(traces + 10 * n)
        ]
        path = os.path.join(directory, f"app-{n}.snap")
        alloctrace.Snapshot(raw, 5).dump(path)
        os.utime(path, (1_700_000_000 + 5 * n, 1_700_000_000 + 5 * n))
        paths.append(path)
    return paths


def many_dumps(work: str, dumps: int, traces: int) -> None:
    directory = os.path.join(work, "series")
    started = time.perf_counter()
    in_child("make_series", directory, dumps, traces)
    made = time.perf_counter() - started
    paths = [os.path.join(directory, f"app-{n}.snap") for n in range(dumps)]
    out = os.path.join(work, "series.html")
    wall, cpu, rss = timed(["report", "-o", out, *paths])
    size = os.path.getsize(out)
    print(f"\nreport over {dumps:,} dumps of {traces:,}+ traces (made in {made:.0f} s)")
    print(
        f"  wall {wall:.2f} s, cpu {cpu:.2f} s, peak RSS {rss / 1024:.0f} MiB, "
        f"page {size / 1024:.0f} KiB"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--traces", default="1000000,10000000", help="snapshot sizes (traces); '' for none"
    )
    parser.add_argument("--frames", default="1,25", help="traceback depths")
    parser.add_argument("--tracebacks", type=int, default=50_000, help="distinct tracebacks")
    parser.add_argument("--dumps", type=int, default=1_000, help="files of the report series")
    parser.add_argument("--dump-traces", type=int, default=20_000, help="traces per dump")
    parser.add_argument("--quick", action="store_true", help="1M traces, 200 dumps")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds")
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.traces, opts.dumps = "1000000", 200
    if opts.smoke:
        opts.traces, opts.tracebacks, opts.dumps, opts.dump_traces = "20000", 500, 20, 500
    import alloctrace

    print(f"alloctrace {alloctrace.__version__}, Python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="alloctrace-offline-") as work:
        for traces in (int(t) for t in opts.traces.split(",") if t):
            for nframe in (int(f) for f in opts.frames.split(",")):
                one_snapshot(work, traces, nframe, min(opts.tracebacks, traces))
        many_dumps(work, opts.dumps, opts.dump_traces)


if __name__ == "__main__":
    main()
