"""Cost of retention paths on a heap of about a million objects.

Builds a heap of N users (each an instance with a ``__dict__``, a list and a str; about four
objects per user plus what the interpreter already holds), then times, with tracing off and
on:

- ``alloctrace.retention(obj)``: one heap walk, a breadth-first search, the dominator tree
  (retained size) and the naming of the reported paths;
- ``alloctrace.referrer_paths(obj)``: the same without needing the retained size (the walk
  and search dominate);
- ``take_snapshot(retention=5)``: a snapshot plus reports for its top five sites (each site's
  retained size is one more search over the graph).

Run: ``python benches/retention.py [--users 250000] [--repeat 3]``. Prints the number of
objects the walk saw and the best and median time of each operation; the figures are not
compared against anything (no other tool answers this question), they show what a call costs.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import types

import alloctrace


class User:
    def __init__(self, i):
        self.name = f"user{i}"
        self.history = [i, i + 1]


def build(n: int) -> types.ModuleType:
    app = types.ModuleType("bench_app")
    sys.modules["bench_app"] = app
    app.users = {i: User(i) for i in range(n)}
    return app


def timed(call, repeat: int) -> tuple[float, float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=250_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    app = build(args.users)
    gc.collect()
    target = app.users[args.users // 2].history
    print(f"python {sys.version.split()[0]}, {args.users:,} users")
    nodes, edges = alloctrace._native._heap_census()[:2]
    print(f"collector-tracked objects: {len(gc.get_objects()):,}; the walk sees {nodes:,} objects")
    print(f"and {edges:,} references")

    for tracing in (False, True):
        if tracing:
            # Rebuild under tracing so that allocation sites are known.
            del app, target
            sys.modules.pop("bench_app", None)
            gc.collect()
            alloctrace.start(1)
            app = build(args.users)
            target = app.users[args.users // 2].history
        label = "tracing on " if tracing else "tracing off"
        best, median, report = timed(lambda t=target: alloctrace.retention(t), args.repeat)
        print(
            f"{label}  retention(obj)        best {best:6.2f} s  median {median:6.2f} s"
            f"  (retained {report.retained_size} B, path: {report.paths[0]})"
        )
        best, median, _ = timed(lambda t=target: alloctrace.referrer_paths(t), args.repeat)
        print(f"{label}  referrer_paths(obj)   best {best:6.2f} s  median {median:6.2f} s")
        if tracing:
            best, median, snap = timed(lambda: alloctrace.take_snapshot(retention=5), args.repeat)
            print(f"{label}  take_snapshot(retention=5) best {best:6.2f} s  median {median:6.2f} s")
            print(str(snap.referrer_paths(snap.statistics("lineno")[0])))
            alloctrace.stop()


if __name__ == "__main__":
    main()
