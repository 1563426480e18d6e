"""Three small loops for counting the hot path's instructions under callgrind, by hand.

Each stresses one path of the hooks:

* ``churn``: a string, a dict, a list and a tuple per iteration, one in 64 kept: blocks that
  die young (allocate-and-free pairs);
* ``keep``: 300,000-string lists built and dropped three times over: blocks that live until
  the list goes;
* ``float``: float arithmetic ``depth`` frames down: objects reused from CPython's float free
  list, re-attributed at every creation;
* ``points``: ``n`` objects of three float attributes each, made, scaled and reduced to their
  maximum, like pyperformance's float benchmark: most blocks live until the end (run under
  ``valgrind --tool=cachegrind --cache-sim=yes`` to count cache misses).

Usage (the figures quoted in ``docs/`` come from runs like these)::

    valgrind --tool=callgrind --smc-check=all python benches/loops.py churn 200000 alloctrace
    python benches/loops.py float 1000000 tracemalloc --depth 10

The last line printed is the loop's wall time, for quick side-by-side runs.
"""

from __future__ import annotations

import argparse
import math
import time


def churn(n: int) -> list:
    keep = []
    for i in range(n):
        s = str(i) + "x"
        d = {"a": i, "b": s}
        t = tuple([i, s, d])
        if i % 64 == 0:
            keep.append(t)
    return keep


def keep(n: int) -> None:
    for _ in range(3):
        kept = [str(i) for i in range(n)]
        del kept


def floats(n: int) -> float:
    x, y, z, vx = 0.1, 0.2, 0.3, 0.01
    for _ in range(n):
        dx = x - y
        dy = y - z
        dz = z - x
        mag = 0.01 * ((dx * dx + dy * dy + dz * dz) ** -1.5)
        vx -= dx * mag
        x += vx * 0.01
        y = (y + 0.5) * 0.999
        z = (z + x) * 0.5
    return x


class Point:
    def __init__(self, i: int) -> None:
        self.x = math.sin(i)
        self.y = math.cos(i) * 3
        self.z = self.x * self.x / 2

    def scale(self) -> None:
        norm = math.sqrt(self.x * self.x + self.y * self.y + self.z * self.z)
        self.x /= norm
        self.y /= norm
        self.z /= norm

    def take_max(self, other: Point) -> Point:
        self.x = max(self.x, other.x)
        self.y = max(self.y, other.y)
        self.z = max(self.z, other.z)
        return self


def points(n: int) -> Point:
    made = [Point(i) for i in range(n)]
    for p in made:
        p.scale()
    best = made[0]
    for p in made[1:]:
        best = best.take_max(p)
    return best


LOOPS = {"churn": churn, "keep": keep, "float": floats, "points": points}


def down(depth: int, loop, n: int):
    return down(depth - 1, loop, n) if depth else loop(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("loop", choices=sorted(LOOPS))
    parser.add_argument("n", type=int, help="iterations")
    parser.add_argument(
        "tracer", nargs="?", default="none", choices=["none", "alloctrace", "tracemalloc"]
    )
    parser.add_argument("--nframe", type=int, default=1)
    parser.add_argument("--depth", type=int, default=0, help="extra frames above the loop")
    parser.add_argument(
        "--sample-interval", type=int, default=0, help="alloctrace's sample_interval"
    )
    parser.add_argument(
        "--count-allocations",
        action="store_true",
        help="alloctrace counts allocations per traceback, as while pushing (alloc_* figures)",
    )
    args = parser.parse_args()
    if args.tracer == "alloctrace":
        import alloctrace

        options = {"sample_interval": args.sample_interval} if args.sample_interval else {}
        alloctrace.start(args.nframe, **options)
        if args.count_allocations:
            alloctrace._native._set_counting_allocations(True)
    elif args.tracer == "tracemalloc":
        import tracemalloc

        tracemalloc.start(args.nframe)
    start = time.perf_counter()
    down(args.depth, LOOPS[args.loop], args.n)
    print(f"{args.loop} {args.tracer} {time.perf_counter() - start:.3f} s")


if __name__ == "__main__":
    main()
