"""Soak of the tracer's own memory under churn: code compiled and dropped, threads started
and ended, ever-new tracebacks, interval dumps, on a flat heap; side by side with tracemalloc
and an untraced run.

Not part of the test suite (run by hand; issue 63 asks for 30 minutes and a million code
objects). Usage::

    python benches/churn_soak.py                       # 30 minutes per tracer
    python benches/churn_soak.py --quick               # 40 seconds per tracer
    python benches/churn_soak.py --seconds 600 --tracers alloctrace,tracemalloc

Each tracer runs in a child process of its own, one after the other. A unit of work is fixed:
it compiles, runs and drops 50 generated modules (each a call chain of 1-8 new functions, so
every unit makes new code objects and new tracebacks), recurses to a depth that changes from
unit to unit (5-60 frames) allocating at the bottom, starts a thread that allocates and ends,
and replaces a slice of a bounded cache (the traced heap stays flat). Every --dump seconds the
child dumps a snapshot to a file (and deletes it). Every --interval seconds it reports the
tracer's own memory (``get_tracemalloc_memory()``), RSS, the traced memory, the mean time per
unit over the interval (wall and CPU: the CPU time is what to compare on a busy machine) and,
for alloctrace, its sweeps (``_sweep_stats()``: the longest pause, live tracebacks, trie nodes,
pinned code objects; ``_sweep_pauses()``: the longest sweep of the program's and of the
readings', what each did and spent its time on, and how many sweeps took over 1, 2, 5 and
10 ms of CPU).

The summary compares the first minute (or first tenth of a shorter run) with the end: the
tracer's memory and the time per unit should stay flat.
"""

import argparse
import json
import subprocess
import sys

CHILD = r"""
import gc, json, os, random, sys, tempfile, threading, time
name, seconds, interval, dump_every, nframe = sys.argv[1], *map(float, sys.argv[2:6])
nframe = int(nframe)
tracer = None
if name == "alloctrace":
    import alloctrace as tracer
elif name == "alloctrace-sampled":
    import alloctrace as tracer
elif name == "tracemalloc":
    import tracemalloc as tracer

rng = random.Random(1)
cache = [None] * 2000
counter = [0]
codes = [0]

# Names come from a bounded set: CPython 3.12 and 3.13 keep every identifier compiled as an
# immortal interned string (one 84-byte block per new name, for good, under any tracer or none),
# so names made anew for each module made the heap grow there. New code objects and new
# tracebacks do not need new names.
NAMES = 1009

def module_source(i, depth):
    lines = []
    for d in range(depth):
        callee = f"f{i % NAMES}_{d + 1}(n)" if d + 1 < depth else f"[n] * {i % 5 + 1}"
        lines.append(
            f"def f{i % NAMES}_{d}(n):\n    x = {{'k': n, 'd': {d}}}\n    return {callee}\n"
        )
    return "".join(lines)

def recurse(depth, n):
    if depth:
        return recurse(depth - 1, n)
    return [bytes(n % 64 + 16) for _ in range(3)]

def in_thread(n):
    junk = [str(k) * 3 for k in range(50)]
    cache[n % len(cache)] = junk[: n % 7]

def unit():
    for _ in range(50):
        i = counter[0]
        counter[0] += 1
        depth = 1 + i % 8
        codes[0] += depth + 1  # the module's code and its functions'
        namespace = {}
        exec(compile(module_source(i, depth), f"<soak-{i % 211}>", "exec"), namespace)
        cache[i % len(cache)] = namespace[f"f{i % NAMES}_0"](i)
    recurse(5 + counter[0] % 56, counter[0])
    t = threading.Thread(target=in_thread, args=(counter[0],))
    t.start()
    t.join()

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

if name == "alloctrace-sampled":
    tracer.start(nframe, sample_interval=4096)
elif tracer is not None:
    tracer.start(nframe)
start = time.monotonic()
next_report = start + interval
next_dump = start + dump_every
units = 0
units_at_report = 0
time_at_report = start
cpu_at_report = time.process_time()
dumps = 0
path = os.path.join(tempfile.mkdtemp(), "soak.snapshot")
while True:
    unit()
    units += 1
    now = time.monotonic()
    if tracer is not None and now >= next_dump:
        tracer.take_snapshot().dump(path)
        os.unlink(path)
        dumps += 1
        next_dump = now + dump_every
    if now >= next_report:
        row = {
            "t": now - start,
            "units": units,
            "code_objects": codes[0],
            "ms_per_unit": 1000 * (now - time_at_report) / max(units - units_at_report, 1),
            "cpu_ms_per_unit": 1000
            * (time.process_time() - cpu_at_report)
            / max(units - units_at_report, 1),
            "rss": rss(),
            "dumps": dumps,
        }
        if tracer is not None:
            row["tracer"] = tracer.get_tracemalloc_memory()
            row["traced"] = tracer.get_traced_memory()[0]
        if name.startswith("alloctrace"):
            sweeps, total, longest, longest_cpu, stacks, nodes, pins = tracer._native._sweep_stats()
            row.update(sweeps=sweeps, sweep_s=total, longest_ms=longest * 1000,
                       longest_cpu_ms=longest_cpu * 1000,
                       tracebacks=stacks, nodes=nodes, pins=pins)
            row["pauses"] = tracer._native._sweep_pauses()
        print(json.dumps(row), flush=True)
        units_at_report, time_at_report = units, time.monotonic()
        cpu_at_report = time.process_time()
        next_report = time_at_report + interval
        if now - start >= seconds:
            break
"""


def run(name, args):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CHILD,
            name,
            str(args.seconds),
            str(args.interval),
            str(args.dump),
            str(args.nframe),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    rows = []
    print(f"\n== {name}")
    print(
        f"{'t (s)':>6} {'code objs':>10} {'ms/unit':>8} {'CPU ms':>7} {'RSS MiB':>8} "
        f"{'tracer MiB':>10} "
        f"{'traced MiB':>10} {'longest sweep ms':>16} {'tracebacks':>10} {'nodes':>8} {'pins':>6}"
    )
    for line in proc.stdout:
        row = json.loads(line)
        rows.append(row)
        mib = {k: f"{row[k] / 2**20:.2f}" if k in row else "-" for k in ("rss", "tracer", "traced")}
        print(
            f"{row['t']:6.0f} {row['code_objects']:10d} {row['ms_per_unit']:8.1f} "
            f"{row['cpu_ms_per_unit']:7.1f} "
            f"{mib['rss']:>8} {mib['tracer']:>10} {mib['traced']:>10} "
            f"{row.get('longest_ms', float('nan')):16.2f} {row.get('tracebacks', '-'):>10} "
            f"{row.get('nodes', '-'):>8} {row.get('pins', '-'):>6}",
            flush=True,
        )
    if proc.wait() != 0:
        raise SystemExit(f"{name} failed with status {proc.returncode}")
    return rows


def summary(name, rows, seconds):
    early_t = min(60.0, seconds / 10)
    early = next((r for r in rows if r["t"] >= early_t), rows[0])
    last = rows[-1]
    tenth = max(1, len(rows) // 10)
    first_ms = sum(r["cpu_ms_per_unit"] for r in rows[:tenth]) / tenth
    last_ms = sum(r["cpu_ms_per_unit"] for r in rows[-tenth:]) / tenth
    parts = [
        f"{name}: {last['code_objects']:,} code objects in {last['t']:.0f} s",
        f"CPU ms/unit first tenth {first_ms:.1f}, last tenth {last_ms:.1f}",
        f"RSS {early['rss'] / 2**20:.1f} MiB at {early['t']:.0f} s -> "
        f"{last['rss'] / 2**20:.1f} MiB",
    ]
    if "tracer" in last:
        parts.append(
            f"tracer {early['tracer'] / 2**20:.2f} MiB at {early['t']:.0f} s -> "
            f"{last['tracer'] / 2**20:.2f} MiB ({last['tracer'] / early['tracer'] - 1:+.1%})"
        )
    if "longest_ms" in last:
        parts.append(
            f"{last['sweeps']} sweeps, {last['sweep_s']:.2f} s in all, longest "
            f"{last['longest_ms']:.2f} ms ({last['longest_cpu_ms']:.2f} ms of CPU)"
        )
        pending, reading, over = last["pauses"]
        parts.append("sweeps over 1/2/5/10 ms of CPU: " + "/".join(str(count) for count in over))
        for kind, (wall, cpu, buried, freed, phases, faults) in zip(
            ("the program's sweeps", "readings' sweeps"), (pending, reading)
        ):
            spent = ", ".join(
                f"{name} {seconds * 1000:.2f}"
                for name, seconds in zip(("collect", "find", "bury", "release"), phases)
            )
            parts.append(
                f"longest of {kind}: {wall * 1000:.2f} ms ({cpu * 1000:.2f} ms of CPU: {spent}), "
                f"{buried} code objects buried, {freed} tracebacks freed, {faults} page faults"
            )
    print("; ".join(parts))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1800)
    parser.add_argument("--interval", type=float, default=10)
    parser.add_argument("--dump", type=float, default=5, help="seconds between dumps")
    parser.add_argument("--nframe", type=int, default=10)
    parser.add_argument("--tracers", default="none,tracemalloc,alloctrace,alloctrace-sampled")
    parser.add_argument("--quick", action="store_true", help="40 s per tracer, 4 s rows")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.interval = 40, 4
    results = {name: run(name, args) for name in args.tracers.split(",")}
    print()
    for name, rows in results.items():
        summary(name, rows, args.seconds)


if __name__ == "__main__":
    main()
