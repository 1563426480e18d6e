"""Soak of pushing: a server-like program traced in sampled mode pushes a profile every second
to a loopback Pyroscope stand-in for SECONDS (10 minutes by default), and prints, every
--every seconds, the tracer's own memory (``get_tracemalloc_memory()``), RSS, the traced
memory and the pusher's counters. Issue 59 asks that the tracer's memory stay flat.

Not part of the test suite. Usage::

    python benches/push_soak.py                  # 600 s, a profile a second
    python benches/push_soak.py --seconds 60 --every 10

The program's live heap is flat (an LRU cache of 20,000 responses, turned over all the time),
so any growth is the tracer's or the pusher's. The summary compares the first row after the
first minute (or tenth of a shorter run) with the last one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import childproc  # noqa: E402 (benches/, beside this file)

PROGRAM = textwrap.dedent(
    """
    import collections, json, random, sys, time
    import alloctrace
    seconds, every = float(sys.argv[1]), float(sys.argv[2])

    def rss_kib():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])

    rng = random.Random(1)
    cache = collections.OrderedDict()
    began = time.monotonic()
    next_row = began + every
    while time.monotonic() - began < seconds:
        for _ in range(200):
            payload = json.dumps({"id": rng.randrange(10**6), "n": list(range(rng.randrange(60)))})
            request = json.loads(payload)
            cache[request["id"]] = json.dumps({"id": request["id"], "sum": sum(request["n"])})
            cache.move_to_end(request["id"])
            while len(cache) > 20000:
                cache.popitem(last=False)
        time.sleep(0.002)
        if time.monotonic() >= next_row:
            next_row += every
            status = alloctrace.get_push_status()
            print(json.dumps({
                "t": time.monotonic() - began,
                "tracer": alloctrace.get_tracemalloc_memory(),
                "rss": rss_kib() * 1024,
                "traced": alloctrace.get_traced_memory()[0],
                "pushed": status["pushed"],
                "failed": status["failed"],
                "gil_ms": status["snapshot_seconds_max"] * 1000,
            }), flush=True)
    """
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--every", type=float, default=30, help="seconds between rows")
    args = parser.parse_args()

    from pushwire import Receiver

    with tempfile.TemporaryDirectory() as tmp, Receiver("connect") as receiver:
        script = os.path.join(tmp, "server.py")
        with open(script, "w") as file:
            file.write(PROGRAM)
        env = childproc.child_env()
        env.update(
            ALLOCTRACE="64",
            ALLOCTRACE_SAMPLE_INTERVAL="512KiB",
            ALLOCTRACE_PUSH=receiver.url,
            ALLOCTRACE_PUSH_INTERVAL="1",
        )
        print(f"Python {sys.version.split()[0]}, {args.seconds:g} s, a profile a second")
        print(
            f"{'t (s)':>6} {'tracer MiB':>10} {'RSS MiB':>8} {'traced MiB':>10} {'pushed':>7} "
            f"{'failed':>6} {'GIL ms max':>10}"
        )
        rows = []
        with subprocess.Popen(
            [sys.executable, script, str(args.seconds), str(args.every)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        ) as child:
            for line in child.stdout:
                row = json.loads(line)
                rows.append(row)
                print(
                    f"{row['t']:>6.0f} {row['tracer'] / 2**20:>10.2f} {row['rss'] / 2**20:>8.2f} "
                    f"{row['traced'] / 2**20:>10.2f} {row['pushed']:>7} {row['failed']:>6} "
                    f"{row['gil_ms']:>10.1f}",
                    flush=True,
                )
        received = len(receiver.requests)
    if child.returncode != 0 or not rows:
        print(f"the program failed (status {child.returncode})")
        return 1
    settled = next((r for r in rows if r["t"] >= min(60, args.seconds / 10)), rows[0])
    last = rows[-1]
    print(
        f"tracer memory {settled['tracer'] / 2**20:.2f} MiB at {settled['t']:.0f} s -> "
        f"{last['tracer'] / 2**20:.2f} MiB at {last['t']:.0f} s "
        f"({(last['tracer'] / settled['tracer'] - 1) * 100:+.1f}%); RSS "
        f"{settled['rss'] / 2**20:.1f} -> {last['rss'] / 2**20:.1f} MiB; "
        f"{received} profiles received"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
