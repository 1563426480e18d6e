"""A worker pool whose workers leak: each task leaves its result in a per-worker cache.

Run it traced and see the whole process tree, the leak summed over the workers:

    alloctrace run examples/pool_leak.py

The summary lists every process (the parent, the pool's workers, multiprocessing's helpers),
then the top lines summed over them: the first is the ``_seen[...] = ...`` line in ``work``,
"in 4 processes" (one per worker). ``alloctrace stats --by-process DIR`` shows each process
apart. The start method is the first argument (fork, spawn or forkserver; default: the
platform's).
"""

import multiprocessing
import sys

_seen = {}


def work(task):
    # The leak: every task's result stays in the worker's cache, never trimmed.
    _seen[task] = bytearray(4096)
    return task * 2


def main(method, tasks):
    context = multiprocessing.get_context(method)
    pool = context.Pool(4)
    done = sum(pool.map(work, range(tasks), chunksize=25))
    # close() and join() let the workers exit; leaving a "with Pool" block would terminate
    # them with SIGTERM instead (they still write their snapshots).
    pool.close()
    pool.join()
    print(f"{tasks} tasks done by {context.get_start_method()} workers (checksum {done})")


if __name__ == "__main__":
    method = sys.argv[1] if len(sys.argv) > 1 else None
    main(method, int(sys.argv[2]) if len(sys.argv) > 2 else 6000)
