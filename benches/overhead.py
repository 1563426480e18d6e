"""Part 1: tracing overhead on real programs (pyperformance's self-contained benchmarks).

Each benchmark script is executed in-process by a child (see ``pyperf_shim``) under one tracing
mode at a time: untraced, tracemalloc and alloctrace, each at nframe 1 and 25, and alloctrace's
sampled mode (default 512 KiB interval, nframe 64).  The parent interleaves the modes benchmark
by benchmark and round by round, and reports the median time of each mode and its slowdown
against the untraced median.  Loop counts are calibrated once,
untraced, so every mode runs exactly the same amount of work.

The child side (:func:`child_main`, started through ``child.py``) measures; the parent
side (:func:`run`) schedules children and aggregates.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import childproc
import pyperf_shim
import tracers


@dataclass(frozen=True)
class Benchmark:
    """A pyperformance benchmark: report name, its ``bm_*`` directory and script arguments."""

    name: str
    directory: str
    argv: tuple[str, ...] = ()
    #: Modules the script must import afresh (it blocks their C accelerator before importing).
    fresh_modules: tuple[str, ...] = ()


BENCHMARKS = (
    Benchmark("float", "bm_float"),
    Benchmark("nbody", "bm_nbody"),
    Benchmark("raytrace", "bm_raytrace"),
    Benchmark("chaos", "bm_chaos"),
    Benchmark("go", "bm_go"),
    Benchmark("hexiom", "bm_hexiom"),
    Benchmark("richards", "bm_richards"),
    Benchmark("deltablue", "bm_deltablue"),
    Benchmark("deepcopy", "bm_deepcopy"),
    Benchmark("json_dumps", "bm_json_dumps"),
    Benchmark("json_loads", "bm_json_loads"),
    Benchmark("xml_etree", "bm_xml_etree"),
    Benchmark("logging", "bm_logging"),
    Benchmark("generators", "bm_generators"),
    Benchmark("regex_compile", "bm_regex_compile"),
    Benchmark("pprint", "bm_pprint"),
    Benchmark("unpack_sequence", "bm_unpack_sequence"),
    Benchmark("nqueens", "bm_nqueens"),
    Benchmark("pickle_pure_python", "bm_pickle", ("--pure-python", "pickle"), ("pickle",)),
    Benchmark("spectral_norm", "bm_spectral_norm"),
    Benchmark("fannkuch", "bm_fannkuch"),
    Benchmark("meteor_contest", "bm_meteor_contest"),
    Benchmark("regex_effbot", "bm_regex_effbot"),
    Benchmark("regex_v8", "bm_regex_v8"),
    Benchmark("pidigits", "bm_pidigits"),
    Benchmark("scimark", "bm_scimark"),
    Benchmark("coroutines", "bm_coroutines"),
    Benchmark("sqlite_synth", "bm_sqlite_synth"),
    Benchmark("telco", "bm_telco"),
    Benchmark("regex_dna", "bm_regex_dna"),
    Benchmark("typing_runtime_protocols", "bm_typing_runtime_protocols"),
    Benchmark("richards_super", "bm_richards_super"),
    Benchmark("comprehensions", "bm_comprehensions"),
)

NFRAMES = (1, 25)

#: alloctrace's sampled modes as measured: (nframe, bytes between samples, whether objects
#: reused from free lists are re-attributed). The target is a geometric-mean slowdown of at most
#: 1.05x at the default interval with deep tracebacks; the second mode is the same without
#: re-attribution (`start(reattribute=False)`), the per-object callback it saves being most of
#: what sampled mode costs.
SAMPLED = ((64, 512 * 1024, True), (64, 512 * 1024, False))

#: The mode that is run in fewer rounds (see Settings.reference_rounds).
SLOW_REFERENCE = "tracemalloc:25"

#: A workload whose one value lasts this many times the target gets one value and no warm-up.
HEAVY_FACTOR = 5


@dataclass(frozen=True)
class Settings:
    """How much work one run does; the presets trade precision for wall-clock time."""

    rounds: int  # interleaved repetitions of every (benchmark, mode) child
    values: int  # timed values per child
    warmups: int  # untimed values per child before the timed ones
    min_time: float  # seconds one value should last, untraced (sets the loop count)
    benchmarks: tuple[Benchmark, ...] = BENCHMARKS
    #: tracemalloc at nframe 25 slows these benchmarks 10-40x, so it dominates the run time;
    #: the quick preset measures nframe 1 only.
    nframes: tuple[int, ...] = NFRAMES
    #: Rounds in which the reference mode tracemalloc:25 runs (it runs in the first ones).  Its
    #: slowdowns are so large that run-to-run noise cannot move the ">=4x less overhead"
    #: verdict, while repeating it would triple the run time.
    reference_rounds: int = 1
    #: Seconds one timed value may last before it is cut short (0: no limit); a cut value
    #: yields a lower bound on the time per operation, reported with a ">=".
    budget: float = 60.0
    #: alloctrace sampled modes run beside the exact ones (see SAMPLED).
    sampled: tuple[tuple[int, int, bool], ...] = SAMPLED
    #: Side-by-side modes at one frame (run.py's --native and --memray): alloctrace's native
    #: mode, memray's three (see tracers). Left out when their tracer cannot run.
    extra: tuple[str, ...] = ()


PRESETS = {
    "full": Settings(rounds=3, values=3, warmups=1, min_time=0.1),
    "quick": Settings(rounds=1, values=1, warmups=0, min_time=0.01, nframes=(1,), budget=20.0),
    "smoke": Settings(
        rounds=1,
        values=1,
        warmups=0,
        min_time=0.002,
        budget=20.0,
        benchmarks=tuple(b for b in BENCHMARKS if b.name in ("deepcopy", "json_loads")),
    ),
}


#: The side-by-side modes run.py's --native, --memray and --fidelity-cost add.
NATIVE_MODES = (tracers.mode("alloctrace", 1, native=True),)
#: Exact tracing at one frame without re-attributing objects reused from free lists: what
#: alloctrace would cost if it gave up answering as tracemalloc does for those objects (the
#: brief ranks those answers above speed, so the cost is measured rather than taken).
FIDELITY_MODES = (tracers.mode("alloctrace", 1, reattribute=False),)
MEMRAY_MODES = tuple(tracers.memray_mode(option) for option in tracers.MEMRAY_OPTIONS)


def modes(
    nframes: tuple[int, ...],
    with_alloctrace: bool,
    sampled: tuple[tuple[int, int, bool], ...] = (),
    extra: tuple[str, ...] = (),
    with_memray: bool = False,
) -> list[str]:
    """All modes part 1 runs, untraced first."""
    result = [tracers.UNTRACED] + [tracers.mode("tracemalloc", n) for n in nframes]
    if with_alloctrace:
        result += [tracers.mode("alloctrace", n) for n in nframes]
        result += [
            tracers.mode("alloctrace", n, interval, reattribute=reattribute)
            for n, interval, reattribute in sampled
        ]
    for spec in extra:
        tracer, _ = tracers.parse(spec)
        if (tracer == "alloctrace" and with_alloctrace) or (tracer == "memray" and with_memray):
            result.append(spec)
    return result


def run(python: str, settings: Settings, with_alloctrace: bool) -> dict[str, Any]:
    """Parent side: calibrate, run every (benchmark, mode) child interleaved, take medians."""
    with_memray = any(spec.startswith("memray") for spec in settings.extra) and (
        childproc.memray_available(python)
    )
    all_modes = modes(
        settings.nframes, with_alloctrace, settings.sampled, settings.extra, with_memray
    )
    loops: dict[str, dict[str, int]] = {}
    errors: dict[str, str] = {}
    for bench in settings.benchmarks:
        childproc.progress(f"[overhead] calibrating {bench.name}")
        try:
            loops[bench.name] = childproc.run_child(
                python,
                "overhead",
                [*_bench_args(bench), "--mode", "none", "--calibrate", str(settings.min_time)],
            )["loops"]
        except childproc.ChildFailed as exc:
            errors[f"{bench.name} (calibration)"] = str(exc)

    # Values by round, so that the report can also show how far apart whole rounds land.
    by_round: dict[tuple[str, str, str], dict[int, list[float]]] = {}
    lower: set[tuple[str, str, str]] = set()
    for round_index in range(settings.rounds):
        for bench_index, bench in enumerate(settings.benchmarks):
            if bench.name not in loops:
                continue
            for spec in childproc.rotated(all_modes, round_index + bench_index):
                if spec == SLOW_REFERENCE and round_index >= settings.reference_rounds:
                    continue
                childproc.progress(
                    f"[overhead] round {round_index + 1}/{settings.rounds} {bench.name} {spec}"
                )
                args = [
                    *_bench_args(bench),
                    "--mode",
                    spec,
                    "--loops",
                    json.dumps(loops[bench.name]),
                    "--values",
                    str(settings.values),
                    "--warmups",
                    str(settings.warmups),
                    "--min-time",
                    str(settings.min_time),
                    "--budget",
                    str(settings.budget),
                ]
                try:
                    answer = childproc.run_child(python, "overhead", args)
                except childproc.ChildFailed as exc:
                    errors[f"{bench.name} under {spec}"] = str(exc)
                    continue
                for workload, values in answer["values"].items():
                    rounds = by_round.setdefault((workload, bench.name, spec), {})
                    rounds.setdefault(round_index, []).extend(values)
                for workload in answer["lower_bound"]:
                    lower.add((workload, bench.name, spec))

    rows = []
    workloads = sorted({(w, b) for (w, b, _) in by_round}, key=lambda wb: (_order(wb[1]), wb[0]))
    for workload, bench_name in workloads:
        medians: dict[str, float] = {}
        per_round: dict[str, list[float | None]] = {}
        for spec in all_modes:
            rounds = by_round.get((workload, bench_name, spec))
            if rounds is None:
                continue
            medians[spec] = childproc.median([v for values in rounds.values() for v in values])
            per_round[spec] = [
                childproc.median(rounds[r]) if r in rounds else None for r in range(settings.rounds)
            ]
        # One value cut short by the budget makes the median a lower bound too.
        at_least = [spec for spec in medians if (workload, bench_name, spec) in lower]
        rows.append(
            {
                "workload": workload,
                "benchmark": bench_name,
                "seconds": medians,
                "per_round": per_round,
                "lower_bound": at_least,
            }
        )
    return {
        "modes": all_modes,
        "nframes": list(settings.nframes),
        "sampled": [list(mode) for mode in settings.sampled] if with_alloctrace else [],
        "extra": [spec for spec in settings.extra if spec in all_modes],
        "extra_absent": [spec for spec in settings.extra if spec not in all_modes],
        "rows": rows,
        "errors": errors,
        "settings": {
            "rounds": settings.rounds,
            "values": settings.values,
            "warmups": settings.warmups,
            "min_time": settings.min_time,
            "reference_rounds": settings.reference_rounds,
            "budget": settings.budget,
        },
    }


def _order(bench_name: str) -> int:
    return [b.name for b in BENCHMARKS].index(bench_name)


def _bench_args(bench: Benchmark) -> list[str]:
    return [
        "--bench",
        bench.directory,
        "--argv",
        json.dumps(list(bench.argv)),
        "--fresh",
        ",".join(bench.fresh_modules),
    ]


def _calibrate(workload: Any, min_time: float) -> tuple[int, float]:
    """Return a loop count whose value lasts at least *min_time* seconds, and that duration."""
    loops = 1
    while True:
        elapsed = workload.seconds_per_op(loops) * loops * workload.inner_loops
        if elapsed >= min_time or loops >= 1 << 30:
            return loops, elapsed
        guess = int(loops * min_time / max(elapsed, 1e-9) * 1.2) + 1
        loops = min(max(guess, loops * 2), loops * 100)


def _parse_child(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="child.py overhead")
    parser.add_argument("--bench", required=True)
    parser.add_argument("--argv", default="[]")
    parser.add_argument("--fresh", default="")
    parser.add_argument("--mode", required=True)
    parser.add_argument("--calibrate", type=float)
    parser.add_argument("--loops")
    parser.add_argument("--values", type=int, default=1)
    parser.add_argument("--min-time", type=float, default=0.0)
    parser.add_argument("--warmups", type=int, default=0)
    parser.add_argument("--budget", type=float, default=0.0)
    parser.add_argument("--result", required=True)
    return parser.parse_args(argv)


def load_workloads(script: Path, argv_json: str, fresh: str) -> list[Any]:
    """The workloads of a benchmark *script* run with the JSON list *argv_json*, the modules
    named in *fresh* (comma-separated) imported anew, as every child loads them (the tracer,
    if any, already started)."""
    for name in filter(None, fresh.split(",")):
        sys.modules.pop(name, None)
    return pyperf_shim.load(script, json.loads(argv_json))


def _script(directory: str) -> Path:
    import pyperformance

    script = Path(pyperformance.__file__).parent / "data-files" / "benchmarks" / directory
    script = script / "run_benchmark.py"
    if not script.is_file():
        raise SystemExit(f"pyperformance {pyperformance.__version__} has no {script}")
    return script


class _OverBudget(Exception):
    """Raised by the interval timer inside a benchmark whose value outlasts --budget."""


def _alarm(signum: int, frame: Any) -> None:
    raise _OverBudget


def _measure(workload: Any, opts: argparse.Namespace, plan: dict[str, Any]) -> list[float]:
    """Time one workload; kept short because it sits on the stack under the benchmark."""
    n, value_seconds = plan[workload.name]
    # A workload whose single loop already lasts several times the target value length needs
    # no warm-up and gets one value per child; the rounds still give it several.
    heavy = value_seconds > HEAVY_FACTOR * opts.min_time
    for _ in range(0 if heavy else opts.warmups):
        workload.seconds_per_op(n)
    tracers.check(opts.mode)
    values = [_timed_value(workload, n, opts.budget) for _ in range(1 if heavy else opts.values)]
    tracers.check(opts.mode)  # the tracer was on (or off) for the whole measurement
    return values


def _timed_value(workload: Any, n: int, budget: float) -> float:
    """One value; if it outlasts *budget*, a lower bound (and the workload is abandoned)."""
    if budget <= 0:
        return workload.seconds_per_op(n)
    signal.signal(signal.SIGALRM, _alarm)
    t0 = time.perf_counter()
    try:
        signal.setitimer(signal.ITIMER_REAL, budget)
        return workload.seconds_per_op(n)
    except _OverBudget:
        # At most n loops ran in the elapsed time, so one operation took at least this long.
        raise _LowerBound((time.perf_counter() - t0) / (n * workload.inner_loops)) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


class _LowerBound(Exception):
    """Carries the lower bound on seconds per operation of a value cut short."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds


def _measure_or_bound(
    workload: Any, opts: argparse.Namespace, plan: dict[str, Any], lower: list[str]
) -> list[float]:
    try:
        return _measure(workload, opts, plan)
    except _LowerBound as bound:
        lower.append(workload.name)
        return [bound.seconds]


def child_main(argv: list[str]) -> None:
    """Child side: run one benchmark script under one mode and time its workloads."""
    opts = _parse_child(argv)
    script = _script(opts.bench)
    # The tracer starts before the script is loaded, as for a program traced from startup.
    tracers.start(opts.mode)
    workloads = load_workloads(script, opts.argv, opts.fresh)
    if opts.calibrate is not None:
        plan = {w.name: _calibrate(w, opts.calibrate) for w in workloads}
        return childproc.write_result(opts.result, {"loops": plan})
    plan = json.loads(opts.loops)
    if isinstance(plan, int):  # one loop count for every workload (used by profile.sh)
        plan = {w.name: (plan, 0.0) for w in workloads}
    lower: list[str] = []
    values = {w.name: _measure_or_bound(w, opts, plan, lower) for w in workloads}
    mod = tracers.module(opts.mode)
    traced = mod.get_traced_memory()[0] if mod is not None else 0
    # A sampled run may legitimately hold no sample at the end; the mode was checked above.
    if mod is not None and traced <= 0 and tracers.sample_interval(opts.mode) is None:
        raise RuntimeError(f"{opts.mode} is tracing but recorded no memory")
    tracers.stop(opts.mode)
    result = {"values": values, "lower_bound": lower, "traced_bytes": traced}
    childproc.write_result(opts.result, result)
