"""Thread storm with the GIL released: many threads alternate allocations made without the GIL
(lzma, bz2 and zlib decompression, decompressor states kept for a while) with Python work,
while the main thread takes snapshots. Checks that nothing crashes or hangs, that no trace is
lost or left behind, and that the blocks allocated without the GIL stay on their calling lines
(issue 56); prints the work done per second.

Not part of the test suite (it runs for a minute; tests/test_released_gil.py has a short
version). Usage::

    python benches/gil_storm.py                      # 60 s, 16 threads, 5 frames
    python benches/gil_storm.py --seconds 5 --threads 8
    python benches/gil_storm.py --tracer tracemalloc  # the same under tracemalloc (or none)

Exit status 1 on a failed check.
"""

import argparse
import bz2
import collections
import lzma
import sys
import threading
import time
import tracemalloc
import zlib

import alloctrace

DATA = bytes(range(256)) * 1024  # 256 KiB
LZ = lzma.compress(DATA, preset=1)
BZ = bz2.compress(DATA, 1)
ZL = zlib.compress(DATA)


def worker(stop, rounds, errors, lines):
    kept = collections.deque(maxlen=4)
    n = 0
    try:
        while not stop.is_set():
            lines["whole"] = sys._getframe().f_lineno + 1
            out = [lzma.decompress(LZ), bz2.decompress(BZ), zlib.decompress(ZL)]
            decompressor = lzma.LZMADecompressor()
            lines["state"] = sys._getframe().f_lineno + 1
            decompressor.decompress(LZ, max_length=4096)
            kept.append(decompressor)
            # Python work with the GIL between the releases.
            words = [str(i) * 3 for i in range(300)]
            table = {w: len(w) for w in words}
            del out, words, table
            n += 1
    except BaseException as exc:
        errors.append(exc)
    kept.clear()
    rounds.append(n)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--nframe", type=int, default=5)
    parser.add_argument(
        "--tracer", choices=("alloctrace", "tracemalloc", "none"), default="alloctrace"
    )
    args = parser.parse_args(argv)
    tracer = {"alloctrace": alloctrace, "tracemalloc": tracemalloc}.get(args.tracer)
    lzma.decompress(LZ), bz2.decompress(BZ), zlib.decompress(ZL)  # first use, untraced
    if tracer:
        tracer.start(args.nframe)
        base = tracer.get_traced_memory()[0]
    stop, rounds, errors, lines = threading.Event(), [], [], {}
    threads = [
        threading.Thread(target=worker, args=(stop, rounds, errors, lines))
        for _ in range(args.threads)
    ]
    started = time.monotonic()
    for t in threads:
        t.start()
    snapshots = 0
    worst_unknown = 0.0
    while time.monotonic() - started < args.seconds:
        time.sleep(0.5)
        if tracer:
            snapshot = tracer.take_snapshot()
            snapshots += 1
            stats = snapshot.statistics("lineno")
            total = sum(s.size for s in stats) or 1
            unknown = sum(s.size for s in stats if s.traceback[0].filename == "<unknown>")
            worst_unknown = max(worst_unknown, unknown / total)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    elapsed = time.monotonic() - started
    failures = []
    if any(t.is_alive() for t in threads):
        failures.append("a worker did not finish (hang)")
    if errors:
        failures.append(f"worker errors: {errors[:3]}")
    if tracer:
        left = [
            s
            for s in tracer.take_snapshot().statistics("lineno")
            if s.traceback[0].filename == __file__
            and s.traceback[0].lineno in (lines.get("whole"), lines.get("state"))
            # A few small blocks stay in the modules' caches, under tracemalloc too.
            and s.size > 64 << 10
        ]
        if left:
            failures.append(f"blocks left on the workers' lines after they ended: {left[:3]}")
        grown = tracer.get_traced_memory()[0] - base
        if grown > 4 << 20:
            failures.append(f"traced memory grew by {grown} bytes over the run")
        if worst_unknown > 0.02:
            failures.append(f"up to {worst_unknown:.1%} of the traced bytes on <unknown>")
        tracer.stop()
    print(
        f"{args.tracer}: {args.threads} threads, {elapsed:.1f} s, {sum(rounds)} rounds "
        f"({sum(rounds) / elapsed:.0f}/s), {snapshots} snapshots, "
        f"worst <unknown> share {worst_unknown:.2%}"
    )
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
