"""Part 5: the cost of object kinds, ``take_snapshot(objects=True)``, on a process holding one
million live objects, against a plain ``take_snapshot()`` of the same process.

The heap is a mix a real program has: instances with attributes, the dicts and lists holding
them, strings and ints, tuples; about a million objects in all, every one allocated while
tracing, so every one has a trace to match. Each child builds it once, then times one kind of
snapshot several times; it also reports how much the process's peak RSS grew during those
snapshots (the walk's graph and the matching tables live in the Rust heap, not in PyMem, so
this is the figure to watch, not get_tracemalloc_memory()). tracemalloc has no equivalent:
its column is empty.

The child side (:func:`child_main`, started through ``child.py``) measures; the parent
side (:func:`run`) schedules children and aggregates.
"""

from __future__ import annotations

import argparse
import gc
import resource
import time
from dataclasses import dataclass
from typing import Any

import childproc

MODES = ("plain", "objects")


@dataclass(frozen=True)
class Settings:
    """Live objects built before measuring, and timed snapshots per mode."""

    objects: int
    repeats: int


PRESETS = {
    "full": Settings(objects=1_000_000, repeats=3),
    "quick": Settings(objects=1_000_000, repeats=1),
    "smoke": Settings(objects=20_000, repeats=1),
}


def run(python: str, settings: Settings, with_alloctrace: bool) -> dict[str, Any]:
    """Parent side: one child per mode (so that peak RSS growth is the mode's own)."""
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    if with_alloctrace:
        for mode in MODES:
            childproc.progress(f"[objects] {mode}, {settings.objects:,} live objects")
            args = ["--objects", str(settings.objects), "--repeats", str(settings.repeats)]
            try:
                results[mode] = childproc.run_child(python, "objects", [*args, "--mode", mode])
            except childproc.ChildFailed as exc:
                errors[mode] = str(exc)
    return {"objects": settings.objects, "by_mode": results, "errors": errors}


class Record:
    def __init__(self, i: int) -> None:
        self.ident = i
        self.label = f"record-{i}"


def build_heap(count: int) -> list[Any]:
    """About *count* live objects: per group of 8, a Record, its label str and ident int (or
    a small cached int), a dict, a list, a tuple, a bytes, and the Record's slot in a list."""
    groups = count // 8
    records = [Record(i + 1000) for i in range(groups)]
    dicts = [{"n": i, "r": r} for i, r in enumerate(records)]
    lists = [[r] for r in records]
    tuples = [(i, str(i)) for i in range(groups)]
    blobs = [bytes(16) + i.to_bytes(8, "little") for i in range(groups)]
    return [records, dicts, lists, tuples, blobs]


def child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="objects.py child")
    parser.add_argument("--objects", type=int, required=True)
    parser.add_argument("--repeats", type=int, required=True)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--result", required=True)
    opts = parser.parse_args(argv)

    import alloctrace

    alloctrace.start(1)
    heap = build_heap(opts.objects)
    gc.collect()
    live = len(gc.get_objects())
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    kinds = None
    traces = 0
    for _ in range(opts.repeats):
        t0 = time.perf_counter()
        snapshot = alloctrace.take_snapshot(objects=opts.mode == "objects")
        times.append(time.perf_counter() - t0)
        traces = len(snapshot.traces)
        if opts.mode == "objects":
            kinds = len(snapshot.statistics("type"))
        del snapshot
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if not alloctrace.is_tracing():
        raise RuntimeError("tracing stopped during the benchmark")
    alloctrace.stop()
    del heap
    childproc.write_result(
        opts.result,
        {
            "seconds": childproc.median(times),
            "peak_rss_growth": (rss_after - rss_before) * 1024,
            "traces": traces,
            "gc_tracked": live,
            "kinds": kinds,
        },
    )
