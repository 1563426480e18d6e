"""Part 2: what the allocation hook itself costs, in nanoseconds per allocation+free pair.

The timed loop allocates exactly one ``bytes`` object per iteration and frees the previous one
(``x = b * k`` with non-constant operands, iterating over ``itertools.repeat`` so the loop
itself allocates nothing).  The hook's cost is the traced time per iteration minus the untraced
time per iteration, measured for three call sites:

* ``shallow``: the loop a few frames below the module level;
* ``deep``: the same loop 50 extra frames down, so capturing many frames has to walk them;
* ``long``: the loop placed after 3,000 lines of code in one generated function, where a tracer
  that maps bytecode offsets to line numbers by scanning the line table from the start pays
  most.

The child side (:func:`child_main`, started through ``child.py``) measures; the parent
side (:func:`run`) schedules children and aggregates.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Callable

import childproc
import tracers

NFRAMES = (1, 25, 100)
DEEP_FRAMES = 50
LONG_LINES = 3000
WORKLOADS = ("shallow", "deep", "long")

_LOOP = "    for _ in repeat(None, n):\n        x = b * k\n    return x\n"


@dataclass(frozen=True)
class Settings:
    """Iteration cap and time per timing, timings per child, interleaved rounds of children.

    A timing runs ``iterations`` iterations unless that would take longer than ``seconds``
    (tracemalloc in the 3,000-line function takes tens of microseconds per allocation), in
    which case the count is cut to fit, never below ``MIN_ITERATIONS``.
    """

    iterations: int
    seconds: float
    repeats: int
    rounds: int


MIN_ITERATIONS = 1_000

PRESETS = {
    "full": Settings(iterations=500_000, seconds=0.2, repeats=5, rounds=3),
    "quick": Settings(iterations=200_000, seconds=0.05, repeats=3, rounds=1),
    "smoke": Settings(iterations=2_000, seconds=0.01, repeats=1, rounds=1),
}


def modes(with_alloctrace: bool) -> list[str]:
    """All modes part 2 runs, untraced first."""
    result = [tracers.UNTRACED] + [tracers.mode("tracemalloc", n) for n in NFRAMES]
    if with_alloctrace:
        result += [tracers.mode("alloctrace", n) for n in NFRAMES]
    return result


def run(python: str, settings: Settings, with_alloctrace: bool) -> dict[str, Any]:
    """Parent side: run every mode's child interleaved, round by round; report medians."""
    all_modes = modes(with_alloctrace)
    samples: dict[tuple[str, str], list[float]] = {}
    errors: dict[str, str] = {}
    for round_index in range(settings.rounds):
        for spec in childproc.rotated(all_modes, round_index):
            childproc.progress(f"[hook] round {round_index + 1}/{settings.rounds} {spec}")
            args = [
                "--mode",
                spec,
                "--iterations",
                str(settings.iterations),
                "--seconds",
                str(settings.seconds),
                "--repeats",
                str(settings.repeats),
            ]
            try:
                answer = childproc.run_child(python, "hook", args)
            except childproc.ChildFailed as exc:
                errors[spec] = str(exc)
                continue
            for workload, values in answer.items():
                samples.setdefault((spec, workload), []).extend(values)
    ns = {
        spec: {w: childproc.median(samples[(spec, w)]) for w in WORKLOADS if (spec, w) in samples}
        for spec in all_modes
    }
    return {
        "modes": all_modes,
        "ns_per_iteration": ns,
        "errors": errors,
        "settings": {
            "iterations": settings.iterations,
            "seconds": settings.seconds,
            "repeats": settings.repeats,
            "rounds": settings.rounds,
        },
    }


def _compile(name: str, source: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {"repeat": repeat}
    exec(compile(source, f"<alloctrace-bench-{name}>", "exec"), namespace)
    return namespace[name]


def make_workloads() -> dict[str, Callable[[int], Any]]:
    """Build the three call sites; each takes an iteration count and runs the loop."""
    loop = _compile("alloc_loop", "def alloc_loop(n, b, k):\n" + _LOOP)
    filler = "    v = n\n" * LONG_LINES
    long_loop = _compile("long_loop", "def long_loop(n, b, k):\n" + filler + _LOOP)
    operand, times = b"ab", 20  # 40 bytes of payload: a small pymalloc block

    def descend(depth: int, n: int) -> Any:
        if depth <= 0:
            return loop(n, operand, times)
        return descend(depth - 1, n)

    return {
        "shallow": lambda n: loop(n, operand, times),
        "deep": lambda n: descend(DEEP_FRAMES, n),
        "long": lambda n: long_loop(n, operand, times),
    }


def child_main(argv: list[str]) -> None:
    """Child side: time every workload under one mode, several times each."""
    parser = argparse.ArgumentParser(prog="hook.py child")
    parser.add_argument("--mode", required=True)
    parser.add_argument("--iterations", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--repeats", type=int, required=True)
    parser.add_argument("--result", required=True)
    opts = parser.parse_args(argv)

    workloads = make_workloads()
    for fn in workloads.values():  # warm up (and let 3.11+ specialise) before tracing starts
        fn(min(opts.iterations, 10_000))
    tracers.start(opts.mode)
    counts = {}
    for name, fn in workloads.items():  # probe the traced cost to size the timed loops
        probe = min(opts.iterations, MIN_ITERATIONS)
        t0 = time.perf_counter()
        fn(probe)
        per_iteration = max(time.perf_counter() - t0, 1e-9) / probe
        fitting = int(opts.seconds / per_iteration)
        counts[name] = max(min(opts.iterations, fitting), min(opts.iterations, MIN_ITERATIONS))
    result: dict[str, list[float]] = {name: [] for name in workloads}
    for _ in range(opts.repeats):
        for name, fn in workloads.items():
            t0 = time.perf_counter_ns()
            fn(counts[name])
            result[name].append((time.perf_counter_ns() - t0) / counts[name])
    tracers.check(opts.mode)
    tracers.stop(opts.mode)
    childproc.write_result(opts.result, result)
