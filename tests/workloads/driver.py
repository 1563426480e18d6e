"""Runs one workload under one tracer and prints its sizes per line (one frame, the default)
or per traceback (NFRAME frames, grouped by the whole stack) as JSON.

    python driver.py {alloctrace|tracemalloc} WORKLOAD.py [NFRAME]

The workload's ``setup()`` (imports, first use) runs untraced; the free lists are emptied
(a full collection does) so that both tracers start from the same state; then ``run()`` is
traced and what it returns is kept alive while the snapshot is taken. Lines of the tracers'
own files and of this driver are left out: each tracer allocates differently for itself.

A workload whose caches keep more or less depending on when the collector runs sets
``COLLECT_BEFORE_SNAPSHOT = True``: ``run()`` then runs with automatic collection off and one
full collection precedes the snapshot, so that both tracers see the same objects survive.
"""

import gc
import importlib.util
import json
import os
import sys


def main():
    tracer_name, path = sys.argv[1:3]
    nframe = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    if tracer_name == "alloctrace":
        import alloctrace as tracer
    else:
        import tracemalloc as tracer
    spec = importlib.util.spec_from_file_location("workload", path)
    workload = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workload)
    workload.setup()
    gc.collect()
    collect = getattr(workload, "COLLECT_BEFORE_SNAPSHOT", False)
    if collect:
        gc.disable()
    tracer.start(nframe)
    kept = workload.run()
    if collect:
        gc.collect()
    snapshot = tracer.take_snapshot()
    tracer.stop()
    own = (os.path.dirname(tracer.__file__), __file__, "tracemalloc.py")
    sizes = {
        " < ".join(f"{frame.filename}:{frame.lineno}" for frame in stat.traceback): stat.size
        for stat in snapshot.statistics("lineno" if nframe == 1 else "traceback")
        for frame in [stat.traceback[-1]]  # the most recent frame
        if not frame.filename.startswith(own[:2]) and not frame.filename.endswith(own[2])
    }
    json.dump(sizes, sys.stdout)
    del kept


if __name__ == "__main__":
    main()
