"""Soak test of ``alloctrace attach``: attach, snapshot and detach one process many times in a
row, and check it is healthy afterwards.

Not part of the test suite (each lldb session takes a second or more). Needs lldb. Usage::

    python benches/attach_soak.py               # 20 rounds
    python benches/attach_soak.py --rounds 3    # quick

The target allocates in a Python loop in its main thread and in 4 more threads. Before the
first round and after the last (each round: attach, one snapshot, detach), it reports its
resident memory, threads and open file descriptors; a round also times the attach and the
detach. Exit status 1 if a round fails, the target stops answering, or it ends with more
threads or descriptors than it started with, or its resident memory is more than
--rss-slack-kib above where it was (the first attach imports alloctrace, and the allocator may
keep some pages). The RSS after each round is printed, to tell a level from a drift.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time

TARGET = textwrap.dedent(
    """\
    import os, sys, threading, time
    def churn():
        cache = []
        while True:
            cache.append([str(i) for i in range(100)])
            del cache[:-50]
            time.sleep(0.001)
    for _ in range(4):
        threading.Thread(target=churn, daemon=True).start()
    def answer():
        for line in sys.stdin:
            with open("/proc/self/status") as f:
                rss = next(l for l in f if l.startswith("VmRSS:")).split()[1]
            print(rss, threading.active_count(), len(os.listdir("/proc/self/fd")), flush=True)
        os._exit(0)
    threading.Thread(target=answer, daemon=True).start()
    print("ready", flush=True)
    keep = []
    while True:
        keep.append(bytearray(100))
        del keep[:-1000]
        time.sleep(0.0005)
    """
)


def command(*args, cwd):
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "alloctrace", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )
    if result.returncode != 0:
        raise SystemExit(f"alloctrace {' '.join(map(str, args))} failed: {result.stderr.strip()}")
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--rss-slack-kib", type=int, default=2048)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        script = os.path.join(work, "target.py")
        with open(script, "w") as stream:
            stream.write(TARGET)
        proc = subprocess.Popen(
            [sys.executable, script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=work,
        )
        assert proc.stdout.readline().strip() == "ready"

        def health():
            proc.stdin.write("?\n")
            proc.stdin.flush()
            rss, threads, fds = map(int, proc.stdout.readline().split())
            return rss, threads, fds

        try:
            # One round first, so that what an attach loads once (alloctrace's modules, the
            # native library) is in the baseline.
            command("attach", proc.pid, cwd=work)
            command("snapshot", proc.pid, cwd=work)
            command("detach", proc.pid, cwd=work)
            before = health()
            attach_times, detach_times = [], []
            rss_per_round = []
            for _ in range(args.rounds):
                attach_times.append(command("attach", proc.pid, cwd=work))
                command("snapshot", proc.pid, cwd=work)
                detach_times.append(command("detach", proc.pid, cwd=work))
                rss_per_round.append(health()[0])
            after = health()
        finally:
            proc.stdin.close()
            proc.wait(timeout=30)
        failures = []
        if after[1] > before[1]:
            failures.append(f"threads {before[1]} -> {after[1]}")
        if after[2] > before[2]:
            failures.append(f"descriptors {before[2]} -> {after[2]}")
        if after[0] > before[0] + args.rss_slack_kib:
            failures.append(f"RSS {before[0]} KiB -> {after[0]} KiB")
        attach_times.sort()
        detach_times.sort()
        print(
            f"{args.rounds} rounds of attach + snapshot + detach on Python "
            f"{sys.version.split()[0]}: RSS {before[0]} KiB -> {after[0]} KiB, threads "
            f"{before[1]} -> {after[1]}, descriptors {before[2]} -> {after[2]}; attach median "
            f"{attach_times[len(attach_times) // 2]:.2f} s (max {attach_times[-1]:.2f} s), "
            f"detach median {detach_times[len(detach_times) // 2]:.2f} s"
        )
        print("RSS after each round (KiB): " + " ".join(map(str, rss_per_round)))
        if failures:
            print("FAIL: " + "; ".join(failures))
            return 1
        print("ok")
        return 0


if __name__ == "__main__":
    sys.exit(main())
