"""Soak test: a server-like workload traced for minutes, checking that the tracer's own
memory stays bounded by the number of live blocks (not by the number of allocations made).

Not part of the test suite (it runs for minutes). Usage::

    python benches/soak.py                    # 5 minutes, 4 worker threads
    python benches/soak.py --seconds 60 --threads 8 --nframe 10

Worker threads handle "requests": parse a payload, build response objects, keep some in a
bounded LRU cache and drop the rest, now and then grow a buffer (realloc) or run a burst that
is freed at once. The main thread samples every --interval seconds: live traced blocks,
traced memory, the tracer's own memory (get_tracemalloc_memory) and its bytes per live block,
then takes a snapshot. Exit status 1 if the tracer's memory ever exceeds
BASE + PER_BLOCK * (peak live blocks so far), or grows in the second half of the run while the
live block count does not.
"""

import argparse
import collections
import json
import random
import sys
import threading
import time

import alloctrace

BASE = 8 << 20  # shards, interned tracebacks, resolver caches
PER_BLOCK = 128  # a trace entry is ~25 bytes; the table keeps at most ~2.3x that per entry


def handle(rng, cache, lock, stats):
    payload = json.dumps({"id": rng.randrange(10**6), "items": list(range(rng.randrange(50)))})
    request = json.loads(payload)
    response = {"id": request["id"], "total": sum(request["items"]), "tag": str(request["id"])}
    body = json.dumps(response).encode()
    if rng.random() < 0.05:
        buf = bytearray(64)
        for _ in range(rng.randrange(1, 20)):
            buf.extend(body)  # realloc, growing
        body = bytes(buf)
    if rng.random() < 0.01:
        burst = [bytes(rng.randrange(1, 4096)) for _ in range(2000)]
        del burst
    with lock:
        cache[request["id"]] = body
        cache.move_to_end(request["id"])
        while len(cache) > 20_000:
            cache.popitem(last=False)
    stats[0] += 1


def worker(seed, stop, cache, lock, stats):
    rng = random.Random(seed)
    while not stop.is_set():
        handle(rng, cache, lock, stats)


def sample():
    alloctrace.disable()  # what we build to measure is not measured
    try:
        live = len(alloctrace._get_traces())
        traced = alloctrace.get_traced_memory()[0]
        own = alloctrace.get_tracemalloc_memory()
    finally:
        alloctrace.enable()
    return live, traced, own


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--interval", type=float, default=5)
    parser.add_argument("--nframe", type=int, default=5)
    args = parser.parse_args(argv)

    alloctrace.start(args.nframe)
    stop = threading.Event()
    cache = collections.OrderedDict()
    lock = threading.Lock()
    stats = [0]
    threads = [
        threading.Thread(target=worker, args=(k, stop, cache, lock, stats), daemon=True)
        for k in range(args.threads)
    ]
    for t in threads:
        t.start()
    start = time.monotonic()
    rows = []
    peak_live = 0
    failures = []
    print(
        f"{'t (s)':>7} {'requests':>10} {'live blocks':>12} {'traced MiB':>11} "
        f"{'tracer MiB':>11} {'B/block':>8}"
    )
    try:
        while time.monotonic() - start < args.seconds:
            time.sleep(args.interval)
            live, traced, own = sample()
            alloctrace.take_snapshot()
            peak_live = max(peak_live, live)
            elapsed = time.monotonic() - start
            rows.append((elapsed, live, own))
            print(
                f"{elapsed:7.0f} {stats[0]:10d} {live:12d} {traced / 2**20:11.1f} "
                f"{own / 2**20:11.1f} {own / max(live, 1):8.0f}",
                flush=True,
            )
            bound = BASE + PER_BLOCK * peak_live
            if own > bound:
                failures.append(f"t={elapsed:.0f}s: tracer uses {own} bytes > bound {bound}")
    finally:
        stop.set()
        for t in threads:
            t.join()
    half = len(rows) // 2
    if half >= 2:
        first = rows[:half]
        second = rows[half:]
        first_own = max(r[2] for r in first)
        first_live = max(r[1] for r in first)
        second_own = max(r[2] for r in second)
        second_live = max(r[1] for r in second)
        if second_own > 1.5 * first_own and second_live <= 1.1 * first_live:
            failures.append(
                f"tracer memory grew from {first_own} to {second_own} bytes while live blocks "
                f"stayed at {first_live} → {second_live}"
            )
    dropped = alloctrace._native.get_dropped_traces()
    alloctrace.stop()
    print(f"requests: {stats[0]}, peak live blocks: {peak_live}, dropped traces: {dropped}")
    for failure in failures:
        print("FAIL:", failure)
    print("OK" if not failures else "FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
