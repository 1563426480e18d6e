"""Part 3: how much memory the tracer keeps per live traced block.

A generated function with a few hundred distinct lines, each appending a fresh ``bytes`` object
to a list, is run until one million (then, in a fresh child, ten million) blocks are alive,
under nframe 1.  The tracer's own account
(growth of ``get_tracemalloc_memory()``) is divided by the number of blocks created, and checked
against what the operating system saw: the growth of the process's resident set size, minus the
growth of an untraced child doing the same work.

The child side (:func:`child_main`, started through ``child.py``) measures; the parent
side (:func:`run`) schedules children and aggregates.
"""

from __future__ import annotations

import argparse
import gc
import os
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Callable

import childproc
import tracers

NFRAME = 1
DISTINCT_LINES = 300


@dataclass(frozen=True)
class Settings:
    """Live block counts to measure at (multiples of the number of distinct lines), rounds."""

    blocks: tuple[int, ...]
    rounds: int


PRESETS = {
    "full": Settings(blocks=(1_000_200, 10_000_200), rounds=2),
    "quick": Settings(blocks=(1_000_200, 10_000_200), rounds=1),
    "smoke": Settings(blocks=(30_000,), rounds=1),
}


def modes(with_alloctrace: bool) -> list[str]:
    """All modes part 3 runs, untraced first."""
    result = [tracers.UNTRACED, tracers.mode("tracemalloc", NFRAME)]
    if with_alloctrace:
        result.append(tracers.mode("alloctrace", NFRAME))
    return result


def run(python: str, settings: Settings, with_alloctrace: bool) -> dict[str, Any]:
    """Parent side: per block count, one child per mode and round, interleaved; medians."""
    all_modes = modes(with_alloctrace)
    counts = []
    errors: dict[str, str] = {}
    for blocks in settings.blocks:
        samples: dict[str, list[dict[str, int]]] = {}
        for round_index in range(settings.rounds):
            for spec in childproc.rotated(all_modes, round_index):
                childproc.progress(
                    f"[memory] {blocks:,} blocks, round {round_index + 1}/{settings.rounds} {spec}"
                )
                try:
                    answer = childproc.run_child(
                        python, "memory", ["--mode", spec, "--blocks", str(blocks)]
                    )
                except childproc.ChildFailed as exc:
                    errors[f"{spec} at {blocks:,} blocks"] = str(exc)
                    continue
                samples.setdefault(spec, []).append(answer)
        figures = {
            spec: {key: childproc.median([s[key] for s in runs]) for key in runs[0]}
            for spec, runs in samples.items()
        }
        counts.append({"blocks": blocks, "figures": figures})
    return {"modes": all_modes, "counts": counts, "errors": errors}


def make_builder() -> Callable[[list[bytes], int, bytes], None]:
    """Compile a function whose loop body has DISTINCT_LINES lines, one allocation each."""
    body = "".join("        keep.append(s * 2)\n" for _ in range(DISTINCT_LINES))
    source = "def build(keep, reps, s):\n    for _ in repeat(None, reps):\n" + body
    namespace: dict[str, Any] = {"repeat": repeat}
    exec(compile(source, "<alloctrace-bench-memory>", "exec"), namespace)
    return namespace["build"]


def rss_bytes() -> int:
    """Resident set size of this process, from /proc."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child_main(argv: list[str]) -> None:
    """Child side: create the live blocks under one mode and report memory figures."""
    parser = argparse.ArgumentParser(prog="memory.py child")
    parser.add_argument("--mode", required=True)
    parser.add_argument("--blocks", type=int, required=True)
    parser.add_argument("--result", required=True)
    opts = parser.parse_args(argv)
    if opts.blocks % DISTINCT_LINES:
        raise SystemExit(f"--blocks must be a multiple of {DISTINCT_LINES}")

    build = make_builder()
    keep: list[bytes] = []
    gc.disable()  # the blocks are bytes (untracked by gc); keep collections out of the picture
    tracers.start(opts.mode)
    mod = tracers.module(opts.mode)
    tracer_before = mod.get_tracemalloc_memory() if mod is not None else 0
    rss_before = rss_bytes()
    build(keep, opts.blocks // DISTINCT_LINES, b"x")
    rss_after = rss_bytes()
    tracer_after = mod.get_tracemalloc_memory() if mod is not None else 0
    traced_now = mod.get_traced_memory()[0] if mod is not None else 0
    tracers.check(opts.mode)
    if len(keep) != opts.blocks:
        raise RuntimeError(f"built {len(keep)} blocks instead of {opts.blocks}")
    childproc.write_result(
        opts.result,
        {
            "rss_growth": rss_after - rss_before,
            "tracer_growth": tracer_after - tracer_before,
            "tracer_total": tracer_after,
            "traced_bytes": traced_now,
        },
    )
    tracers.stop(opts.mode)
