"""Part ``instructions``: tracing cost on pyperformance's workloads, counted in instructions.

The timed ``overhead`` part is the primary measure, but on a shared machine (two cores, other
people compiling) wall-clock ratios move by ±10% or more from run to run.  This part runs the
same benchmark scripts under ``valgrind --tool=callgrind`` and reports, per workload and mode,
the instructions executed by the workload alone, and their ratio to the untraced run.  The counts
repeat almost exactly whatever the machine's load, so they can compare two commits on a busy
machine.  They are instruction ratios, not time: cache misses, branch mispredictions and the
cost of touching fresh memory are not counted, so a tracer whose table misses the cache costs
more time than its instruction ratio says.

How the workload alone is counted: the child loads the script and runs each workload once as a
warm-up (imports, caches, the tracer's first table growth), then brackets the counted loops with
two cheap libc calls nothing else in the child makes, ``getpgrp()`` before and ``getsid()``
after.  callgrind is told to zero its counters on entering the first and to write a dump on
entering the second (``--zero-before=getpgrp --dump-before=getsid``), so each dump holds one
workload's loops and nothing of interpreter start-up or script loading.

Loop counts are calibrated once per benchmark without valgrind (untraced, about ``min_time``
seconds per workload) and rounded down to a power of two, so that two runs on different days
mostly count the same work; the table prints them.  Under callgrind a workload runs ~50-100x
slower than natively, which is what ``min_time`` is sized for.

memray columns: the untraced child is run under ``python -m memray run`` (default, and with
``--trace-python-allocators``), so memray's tracker is active for the whole child like the other
tracers; its output file goes to a temporary directory and is deleted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import childproc
import overhead
import tracers

#: Modes beyond the tracers module's own: the untraced child run under memray.
MEMRAY = "memray"
MEMRAY_PY = "memray-py"
MEMRAY_MODES = {MEMRAY: (), MEMRAY_PY: ("--trace-python-allocators",)}

#: Targets of issue 20 (instruction ratios stand in for time here; see the module docstring).
GEOMEAN_MAX = {1: 1.3, 25: 1.7}
ROW_MAX_NFRAME1 = 2.0
OVERHEAD_CUT_MIN = 4.0
TRACEMALLOC_COSTLY = 1.5


@dataclass(frozen=True)
class Settings:
    """What one instruction-count run measures."""

    min_time: float  # native untraced seconds per workload used to pick the loop count
    benchmarks: tuple[overhead.Benchmark, ...] = overhead.BENCHMARKS
    #: alloctrace's exact modes; tracemalloc runs at ``reference_nframes`` only, because at
    #: nframe 25 it runs 10-40x the instructions and would dominate a run under valgrind.
    nframes: tuple[int, ...] = (1, 25)
    reference_nframes: tuple[int, ...] = (1,)
    #: The default sampled mode only (with re-attribution).
    sampled: tuple[tuple[int, int, bool], ...] = overhead.SAMPLED[:1]
    memray: bool = True
    timeout: float = 900.0


PRESETS = {
    "full": Settings(min_time=0.04),
    "quick": Settings(min_time=0.02),
    "smoke": Settings(
        min_time=0.002,
        benchmarks=tuple(b for b in overhead.BENCHMARKS if b.name in ("deepcopy", "json_loads")),
        nframes=(1,),
        sampled=(),
    ),
}


def modes(settings: Settings, with_alloctrace: bool, with_memray: bool) -> list[str]:
    """Every mode this part runs, untraced first."""
    result = [tracers.UNTRACED]
    result += [tracers.mode("tracemalloc", n) for n in settings.reference_nframes]
    if with_alloctrace:
        result += [tracers.mode("alloctrace", n) for n in settings.nframes]
        result += [tracers.mode("alloctrace", n, i, reattribute=r) for n, i, r in settings.sampled]
    if with_memray:
        result += list(MEMRAY_MODES)
    return result


def _power_of_two_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def run(python: str, settings: Settings, with_alloctrace: bool) -> dict[str, Any]:
    """Parent side: calibrate natively, then count every (benchmark, mode) under callgrind."""
    if shutil.which("valgrind") is None:
        raise SystemExit("the instructions part needs valgrind (apt-get install valgrind)")
    with_memray = settings.memray and childproc.memray_available(python)
    if not settings.memray:
        memray_absent = "left out (--no-memray)"
    else:
        memray_absent = "" if with_memray else "memray is not importable in this interpreter"
    all_modes = modes(settings, with_alloctrace, with_memray)
    errors: dict[str, str] = {}
    rows: list[dict[str, Any]] = []
    for bench in settings.benchmarks:
        childproc.progress(f"[instructions] calibrating {bench.name}")
        try:
            plan = childproc.run_child(
                python,
                "overhead",
                [*_bench_args(bench), "--mode", "none", "--calibrate", str(settings.min_time)],
            )["loops"]
        except childproc.ChildFailed as exc:
            errors[f"{bench.name} (calibration)"] = str(exc)
            continue
        loops = {name: _power_of_two_floor(n) for name, (n, _) in plan.items()}
        counts: dict[str, dict[str, int]] = {}
        for spec in all_modes:
            childproc.progress(f"[instructions] {bench.name} {spec}")
            try:
                counts[spec] = count(python, bench, spec, loops, settings.timeout)
            except (childproc.ChildFailed, subprocess.TimeoutExpired) as exc:
                errors[f"{bench.name} under {spec}"] = str(exc)
        for workload in loops:
            rows.append(
                {
                    "workload": workload,
                    "benchmark": bench.name,
                    "loops": loops[workload],
                    "instructions": {
                        spec: per[workload] for spec, per in counts.items() if workload in per
                    },
                }
            )
    return {
        "modes": all_modes,
        "nframes": list(settings.nframes),
        "reference_nframes": list(settings.reference_nframes),
        "sampled": [list(p) for p in settings.sampled] if with_alloctrace else [],
        "memray": with_memray,
        "memray_absent": memray_absent,
        "min_time": settings.min_time,
        "rows": rows,
        "errors": errors,
    }


def count(
    python: str, bench: overhead.Benchmark, spec: str, loops: dict[str, int], timeout: float
) -> dict[str, int]:
    """Run one child under callgrind; return the instructions of each workload's loops."""
    with tempfile.TemporaryDirectory(prefix="alloctrace-cg-") as tmp:
        out = Path(tmp) / "cg.out"
        result = Path(tmp) / "result.json"
        child_mode = tracers.UNTRACED if spec in MEMRAY_MODES else spec
        child = [
            str(childproc.BENCH_DIR / "child.py"),
            "instructions",
            *_bench_args(bench),
            "--mode",
            child_mode,
            "--loops",
            json.dumps(loops),
            "--result",
            str(result),
        ]
        if spec in MEMRAY_MODES:
            memray_out = Path(tmp) / "memray.bin"
            child = ["-m", "memray", "run", "-q", *MEMRAY_MODES[spec], "-o", str(memray_out)]
            child += [str(childproc.BENCH_DIR / "child.py"), *_child_tail(bench, loops, result)]
        cmd = [
            "valgrind",
            "--tool=callgrind",
            # On 3.9-3.12 alloctrace rewrites two operands of _Py_NewReference in libpython's
            # code at start() (docs/freelists.md). valgrind re-reads changed code only outside
            # file mappings by default, so without this it keeps running the unpatched code:
            # every object creation's re-attribution would go uncounted.
            "--smc-check=all",
            "--zero-before=getpgrp",
            "--dump-before=getsid",
            f"--callgrind-out-file={out}",
            python,
            *child,
        ]
        proc = subprocess.run(
            cmd,
            env=childproc.child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0 or not result.exists():
            tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
            raise childproc.ChildFailed(f"{' '.join(cmd)} exited with {proc.returncode}:\n{tail}")
        order = json.loads(result.read_text())["workloads"]
        dumps = sorted(Path(tmp).glob("cg.out.*"), key=lambda p: int(p.suffix[1:]))
        # One dump per workload, in order; the final dump at exit has no trigger and comes last.
        if len(dumps) < len(order):
            raise childproc.ChildFailed(f"{' '.join(cmd)}: {len(dumps)} dumps for {order}")
        return {name: _instructions(dump) for name, dump in zip(order, dumps)}


def _child_tail(bench: overhead.Benchmark, loops: dict[str, int], result: Path) -> list[str]:
    return [
        "instructions",
        *_bench_args(bench),
        "--mode",
        tracers.UNTRACED,
        "--loops",
        json.dumps(loops),
        "--result",
        str(result),
    ]


def _instructions(dump: Path) -> int:
    """The event total of one callgrind dump file (its ``summary:`` or ``totals:`` line)."""
    total = None
    with open(dump) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
    if total is None:
        raise childproc.ChildFailed(f"{dump} has no summary line")
    return total


def _bench_args(bench: overhead.Benchmark) -> list[str]:
    return [
        "--bench",
        bench.directory,
        "--argv",
        json.dumps(list(bench.argv)),
        "--fresh",
        ",".join(bench.fresh_modules),
    ]


def child_main(argv: list[str]) -> None:
    """Child side: run each workload once, then its loops between the two marker calls."""
    parser = argparse.ArgumentParser(prog="child.py instructions")
    parser.add_argument("--bench", required=True)
    parser.add_argument("--argv", default="[]")
    parser.add_argument("--fresh", default="")
    parser.add_argument("--mode", required=True)
    parser.add_argument("--loops", required=True)
    parser.add_argument("--result", required=True)
    opts = parser.parse_args(argv)
    script = overhead._script(opts.bench)
    tracers.start(opts.mode)
    workloads = overhead.load_workloads(script, opts.argv, opts.fresh)
    loops = json.loads(opts.loops)
    order = []
    for workload in workloads:
        workload.seconds_per_op(1)  # warm-up, not counted
        tracers.check(opts.mode)
        os.getpgrp()  # callgrind zeroes its counters here
        workload.seconds_per_op(loops[workload.name])
        os.getsid(0)  # ... and dumps them here
        tracers.check(opts.mode)
        order.append(workload.name)
    tracers.stop(opts.mode)
    childproc.write_result(opts.result, {"workloads": order})


def _label(spec: str) -> str:
    if spec in MEMRAY_MODES:
        return "memray run" + "".join(" " + a for a in MEMRAY_MODES[spec])
    tracer, nframe = tracers.parse(spec)
    interval = tracers.sample_interval(spec)
    if interval is not None:
        return f"{tracer} {nframe}, sampled {interval // 1024} KiB"
    return f"{tracer} {nframe}"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "**MISS**"


def render(facts: dict[str, Any], part: dict[str, Any]) -> str:
    """The markdown section of one interpreter: header, one row per workload, geomeans, goals."""
    interp, machine = facts["interpreter"], facts["machine"]
    traced = [m for m in part["modes"] if m != tracers.UNTRACED]
    lines = [
        f"### alloctrace instruction counts (callgrind, not time): {interp['python']}",
        "",
        f"- Command: `{facts['command']}`",
        f"- Machine: {machine['cpu']}, {machine['cores']} cores; interpreter "
        f"{interp['executable']}; pyperformance {interp['pyperformance']}; alloctrace "
        f"{interp['alloctrace']} from commit {facts['commit']}; {facts['date']}, "
        f"wall time {facts['wall']}",
        "- Figures are **instruction ratios** (traced instructions / untraced instructions of "
        "the same loops, counted by `valgrind --tool=callgrind`), not time: cache misses and "
        "page faults are not counted. Loop counts: calibrated to ~"
        f"{part['min_time']:g} s untraced without valgrind, rounded down to a power of two.",
        "",
        "| workload | loops | untraced Minstr | " + " | ".join(map(_label, traced)) + " |",
        "|---|---|---|" + "---|" * len(traced),
    ]
    ratios: dict[str, list[float]] = {m: [] for m in traced}
    full_rows = []
    for row in part["rows"]:
        counts = row["instructions"]
        base = counts.get(tracers.UNTRACED)
        if not base:
            continue
        cells = []
        entry = {}
        for spec in traced:
            if spec in counts:
                r = counts[spec] / base
                entry[spec] = r
                ratios[spec].append(r)
                cells.append(f"{r:.2f}x")
            else:
                cells.append("failed")
        full_rows.append((row["workload"], entry))
        lines.append(
            f"| {row['workload']} | {row['loops']} | {base / 1e6:.1f} | " + " | ".join(cells) + " |"
        )
    means = {m: childproc.geomean(v) for m, v in ratios.items() if v}
    lines.append(
        f"| **geometric mean** of {len(full_rows)} | | | "
        + " | ".join(f"**{means[m]:.2f}x**" if m in means else "—" for m in traced)
        + " |"
    )
    lines += ["", "Targets of issue 20, checked on these instruction ratios:", ""]
    for nframe, limit in GEOMEAN_MAX.items():
        spec = f"alloctrace:{nframe}"
        if spec in means:
            lines.append(
                f"- geomean at nframe {nframe} ≤{limit:g}x: {means[spec]:.2f}x "
                f"{_verdict(means[spec] <= limit)}"
            )
    if "alloctrace:1" in means:
        worst = max(full_rows, key=lambda r: r[1].get("alloctrace:1", 0))
        lines.append(
            f"- every row ≤{ROW_MAX_NFRAME1:g}x at nframe 1: worst {worst[0]} "
            f"{worst[1]['alloctrace:1']:.2f}x {_verdict(worst[1]['alloctrace:1'] <= 2)}"
        )
        misses = []
        costly = 0
        for name, entry in full_rows:
            tm, at = entry.get("tracemalloc:1"), entry.get("alloctrace:1")
            if tm is None or at is None or tm < TRACEMALLOC_COSTLY:
                continue
            costly += 1
            if at > 1 and (tm - 1) / (at - 1) < OVERHEAD_CUT_MIN:
                misses.append(f"{name} ({(tm - 1) / (at - 1):.1f}x)")
        lines.append(
            f"- ≥{OVERHEAD_CUT_MIN:g}x less overhead than tracemalloc at nframe 1 on the "
            f"{costly} rows where tracemalloc costs ≥{TRACEMALLOC_COSTLY:g}x: "
            + (_verdict(False) + ": " + ", ".join(misses) if misses else _verdict(True))
        )
    sampled = [m for m in means if tracers.UNTRACED != m and "@" in m]
    for spec in sampled:
        lines.append(
            f"- sampled ({_label(spec)}) geomean ≤1.05x: {means[spec]:.2f}x "
            f"{_verdict(means[spec] <= 1.05)} (instructions as a proxy for time)"
        )
    if not part["memray"]:
        lines.append(f"- memray columns absent: {part.get('memray_absent') or 'not measured'}")
    if part["errors"]:
        lines += ["", "Failures (the affected cells read 'failed' or are missing):", ""]
        lines += [
            f"- {what}: {msg.splitlines()[-1] if msg else ''}"
            for what, msg in part["errors"].items()
        ]
    return "\n".join(lines) + "\n"
