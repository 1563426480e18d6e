"""What pushing profiles to Pyroscope adds to sampled tracing: the same workload untraced,
sampled at 512 KiB, and sampled at 512 KiB while pushing every INTERVAL seconds to a loopback
server that accepts the Connect push API, side by side, rounds interleaved.

Not part of the test suite. Usage::

    python benches/push.py                    # 3 rounds of ~60 s programs, pushing every 15 s
    python benches/push.py --quick            # 1 round of ~6 s programs, pushing every 1 s

Each program runs a fixed amount of server-like work (JSON in, objects out, an LRU cache of
20,000 responses, so a live heap of tens of MB and many tracebacks) and prints its wall time;
the pushing one also prints its pusher's counters, among them the longest time taking a
profile held the GIL. Ratios are of median wall times against the untraced program; a second
table gives each program's CPU time (user + system, all its threads, start-up included), which a
machine busy with other work disturbs less than wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import childproc  # noqa: E402 (benches/, beside this file)

WORKLOAD = textwrap.dedent(
    """
    import collections, json, random, sys, time
    iterations = int(sys.argv[1])
    rng = random.Random(1)
    cache = collections.OrderedDict()
    began = time.perf_counter()
    for i in range(iterations):
        payload = json.dumps({"id": rng.randrange(10**6), "items": list(range(rng.randrange(60)))})
        request = json.loads(payload)
        body = json.dumps({"id": request["id"], "total": sum(request["items"]),
                           "tags": [str(x) for x in request["items"][:10]]}).encode()
        cache[request["id"]] = body
        cache.move_to_end(request["id"])
        while len(cache) > 20000:
            cache.popitem(last=False)
    elapsed = time.perf_counter() - began
    status = None
    if "alloctrace" in sys.modules:
        import alloctrace
        status = alloctrace.get_push_status()
    print(json.dumps({"elapsed": elapsed, "push": status}))
    """
)


def run(script: str, iterations: int, env: dict) -> dict:
    """The workload's own result, with "cpu": the child's user + system seconds."""
    full = childproc.child_env()
    full.update(env)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, script, str(iterations)],
        env=full,
        capture_output=True,
        text=True,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(done.stdout.splitlines()[-1])
    result["cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short round")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--interval", type=float, default=None, help="push interval, seconds")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    iterations = args.iterations or (60_000 if args.quick else 600_000)
    interval = args.interval or (1.0 if args.quick else 15.0)

    from pushwire import Receiver

    with tempfile.TemporaryDirectory() as tmp, Receiver("connect") as receiver:
        script = os.path.join(tmp, "workload.py")
        with open(script, "w") as file:
            file.write(WORKLOAD)
        modes = {
            "untraced": {},
            "sampled 512KiB": {"ALLOCTRACE": "64", "ALLOCTRACE_SAMPLE_INTERVAL": "512KiB"},
            f"sampled + push every {interval:g}s": {
                "ALLOCTRACE": "64",
                "ALLOCTRACE_SAMPLE_INTERVAL": "512KiB",
                "ALLOCTRACE_PUSH": receiver.url,
                "ALLOCTRACE_PUSH_INTERVAL": str(interval),
            },
        }
        times: dict[str, list[float]] = {name: [] for name in modes}
        cpu_times: dict[str, list[float]] = {name: [] for name in modes}
        statuses = []
        for _ in range(rounds):
            for name, env in modes.items():
                result = run(script, iterations, env)
                times[name].append(result["elapsed"])
                cpu_times[name].append(result["cpu"])
                if result["push"]:
                    statuses.append(result["push"])
        pushes = len(receiver.pushes())
    print(
        f"{sys.implementation.name} {sys.version.split()[0]}, {rounds} round(s), "
        f"{iterations} iterations"
    )
    print("wall time of the work loop:")
    print("\n".join(childproc.ratio_table(times, "untraced", width=30, rounds=True)))
    print("CPU time of the whole process:")
    print("\n".join(childproc.ratio_table(cpu_times, "untraced", width=30, rounds=True)))
    for label, table in (("wall", times), ("CPU", cpu_times)):
        sampled = childproc.median(table["sampled 512KiB"])
        pushing = childproc.median(table[list(modes)[-1]])
        print(f"pushing vs sampled alone ({label}): {pushing / sampled:.3f}x")
    if statuses:
        worst = max(s["snapshot_seconds_max"] for s in statuses)
        sent = sum(s["pushed"] for s in statuses)
        failed = sum(s["failed"] for s in statuses)
        cpu = sum(s["thread_cpu_seconds"] for s in statuses)
        print(
            f"profiles pushed during the runs: {sent} (received in all: {pushes}), failed "
            f"{failed}; longest GIL hold to take one: {worst * 1000:.1f} ms; pusher thread "
            f"CPU {cpu * 1000 / max(sent, 1):.1f} ms per profile"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
