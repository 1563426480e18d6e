"""The cost of ``alloctrace run`` on a multi-process program: a worker pool, untraced against
traced into a capture (every process traced, the tree summarised) and with ``--no-capture``
(every process traced, one file each, the parent's summary only).

    python benches/process_tree.py [--quick] [--method fork|spawn|forkserver] [--rounds N]

Runs ``examples/pool_leak.py`` (four workers) in each mode, modes interleaved round by round so
that a shared machine's noise falls on all of them alike, and prints the median wall time of
each and its ratio to the untraced run. Wall time, since the work is spread over processes;
the traced runs include writing every process's snapshot and, for ``run``, its summary.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import childproc

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "pool_leak.py"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds of 3000 tasks")
    parser.add_argument("--method", default="fork", choices=("fork", "spawn", "forkserver"))
    parser.add_argument("--rounds", type=int, help="rounds (default: 3 quick, 10 full)")
    parser.add_argument("--tasks", type=int, help="tasks (default: 3000 quick, 20000 full)")
    opts = parser.parse_args(argv)
    rounds = opts.rounds or (3 if opts.quick else 10)
    tasks = str(opts.tasks or (3000 if opts.quick else 20000))
    env = childproc.child_env()
    program = [str(EXAMPLE), opts.method, tasks]
    modes = {
        "untraced": [sys.executable, *program],
        "run (capture)": [sys.executable, "-m", "alloctrace", "run", "--capture", "cap", *program],
        "run --no-capture": [sys.executable, "-m", "alloctrace", "run", "--no-capture", *program],
    }
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(rounds):
        for mode, command in modes.items():
            work = tempfile.mkdtemp(prefix="alloctrace-tree-bench-")
            try:
                start = time.perf_counter()
                subprocess.run(
                    command,
                    cwd=work,
                    env=env,
                    check=True,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                times[mode].append(time.perf_counter() - start)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    print(
        f"examples/pool_leak.py {opts.method} {tasks} tasks, 4 workers, {rounds} rounds, "
        f"Python {sys.version.split()[0]}"
    )
    print("\n".join(childproc.ratio_table(times, "untraced")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
