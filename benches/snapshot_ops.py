"""Part 4: snapshot operations on one million traces, alloctrace against tracemalloc.

Both snapshot classes are built from the very same list of tracemalloc-style raw tuples
``(domain, size, frames, total_nframe)`` (``frames`` being ``((filename, lineno), ...)``), so
both answer the same question over identical data.  The traces come from a seeded generator that
mimics a real program: a few thousand distinct call stacks drawn from a pool of source lines, with
shared outer frames, and mostly small sizes.  Each operation is timed on freshly built snapshots
(so no cached answer can be reused), tracemalloc and alloctrace alternating, several times.

The child side (:func:`child_main`, started through ``child.py``) measures; the parent
side (:func:`run`) schedules children and aggregates.
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

import childproc

NFRAMES = (1, 25)
OPERATIONS = (
    "statistics('lineno')",
    "statistics('traceback')",
    "compare_to",
    "filter_traces",
    "dump",
    "load",
)
DISTINCT_STACKS = 5_000
DISTINCT_LINES = 2_000


@dataclass(frozen=True)
class Settings:
    """Traces per snapshot and timed repetitions of each operation."""

    traces: int
    repeats: int


PRESETS = {
    "full": Settings(traces=1_000_000, repeats=3),
    "quick": Settings(traces=1_000_000, repeats=1),
    "smoke": Settings(traces=20_000, repeats=1),
}


def run(python: str, settings: Settings, with_alloctrace: bool) -> dict[str, Any]:
    """Parent side: one child per nframe; each alternates the two implementations."""
    impls = ["tracemalloc"] + (["alloctrace"] if with_alloctrace else [])
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for nframe in NFRAMES:
        childproc.progress(f"[snapshot] nframe {nframe}, {settings.traces} traces")
        args = [
            "--nframe",
            str(nframe),
            "--traces",
            str(settings.traces),
            "--repeats",
            str(settings.repeats),
            "--impls",
            ",".join(impls),
        ]
        try:
            results[str(nframe)] = childproc.run_child(python, "snapshot_ops", args)
        except childproc.ChildFailed as exc:
            errors[f"nframe {nframe}"] = str(exc)
    return {"impls": impls, "by_nframe": results, "errors": errors, "traces": settings.traces}


def make_raw(count: int, nframe: int, seed: int) -> list[tuple[Any, ...]]:
    """Generate *count* raw traces whose tracebacks hold at most *nframe* frames."""
    rng = random.Random(seed)
    files = [f"/srv/app/pkg{i % 12}/module{i}.py" for i in range(60)]
    lines = [(rng.choice(files), rng.randint(1, 3_000)) for _ in range(DISTINCT_LINES)]
    # Call stacks share their outer part, as real programs' stacks do: a handful of entry
    # points, then a middle layer, then the allocating frames.
    outer = [tuple(rng.choice(lines) for _ in range(12)) for _ in range(8)]
    stacks = []
    for _ in range(DISTINCT_STACKS):
        depth = rng.randint(3, 40)
        inner = tuple(rng.choice(lines) for _ in range(max(depth - 12, 1)))
        full = inner + rng.choice(outer)  # most recent frame first, as tracemalloc stores it
        stacks.append((full[:nframe], len(full)))
    domains = [0] * 99 + [42]
    raw = []
    for _ in range(count):
        frames, total = stacks[int(rng.paretovariate(1.2)) % DISTINCT_STACKS]
        size = int(rng.expovariate(1 / 120)) + 8
        raw.append((rng.choice(domains), size, frames, total))
    return raw


def _operations(mod: Any, new: Any, old: Any, path: str) -> dict[str, Callable[[], Any]]:
    filters = [
        mod.Filter(False, "/srv/app/pkg3/*"),
        mod.Filter(True, "*.py", all_frames=True),
    ]
    return {
        "statistics('lineno')": lambda: new.statistics("lineno"),
        "statistics('traceback')": lambda: new.statistics("traceback"),
        "compare_to": lambda: new.compare_to(old, "lineno"),
        "filter_traces": lambda: new.filter_traces(filters),
        "dump": lambda: new.dump(path),
        "load": lambda: mod.Snapshot.load(path),
    }


def child_main(argv: list[str]) -> None:
    """Child side: build the raw traces once, then time every operation per implementation."""
    parser = argparse.ArgumentParser(prog="snapshot_ops.py child")
    parser.add_argument("--nframe", type=int, required=True)
    parser.add_argument("--traces", type=int, required=True)
    parser.add_argument("--repeats", type=int, required=True)
    parser.add_argument("--impls", required=True)
    parser.add_argument("--result", required=True)
    opts = parser.parse_args(argv)

    impls = {name: importlib.import_module(name) for name in opts.impls.split(",")}
    raw_new = make_raw(opts.traces, opts.nframe, seed=1)
    # The "old" snapshot shares 90% of the traces and has 10% of its own, for compare_to.
    keep = opts.traces - opts.traces // 10
    raw_old = raw_new[:keep] + make_raw(opts.traces - keep, opts.nframe, seed=2)

    times: dict[str, dict[str, list[float]]] = {n: {op: [] for op in OPERATIONS} for n in impls}
    sizes: dict[str, int] = {}
    counts: dict[str, int] = {}
    tmpdir = tempfile.mkdtemp(prefix="alloctrace-bench-")
    try:
        for repeat_index in range(opts.repeats):
            for op in OPERATIONS:
                for name in childproc.rotated(list(impls), repeat_index):
                    mod = impls[name]
                    path = os.path.join(tmpdir, f"{name}.snapshot")
                    new = mod.Snapshot(raw_new, opts.nframe)
                    old = mod.Snapshot(raw_old, opts.nframe)
                    ops = _operations(mod, new, old, path)
                    if op == "load" and not os.path.exists(path):
                        new.dump(path)
                    # Start each timing with nothing left to write back: an unsynced pickle
                    # (tracemalloc's dump) or a replaced file's freed blocks would otherwise be
                    # written or discarded during the next operation, charged to whichever
                    # implementation syncs or runs next (the journal commit that an fsync
                    # forces carries them too).
                    os.sync()
                    t0 = time.perf_counter()
                    answer = ops[op]()
                    times[name][op].append(time.perf_counter() - t0)
                    if op == "dump":
                        sizes[name] = os.path.getsize(path)
                    if op == "statistics('lineno')":
                        counts[name] = len(answer)
                    del new, old, answer
    finally:
        for entry in os.listdir(tmpdir):
            os.unlink(os.path.join(tmpdir, entry))
        os.rmdir(tmpdir)
    if len(set(counts.values())) > 1:
        raise RuntimeError(f"implementations disagree on statistics('lineno') length: {counts}")
    childproc.write_result(
        opts.result,
        {
            "seconds": {
                n: {op: childproc.median(v) for op, v in t.items()} for n, t in times.items()
            },
            "dump_bytes": sizes,
            "lineno_groups": counts,
        },
    )
