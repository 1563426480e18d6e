"""Run alloctrace's benchmark suite and print one markdown table per interpreter.

Usage::

    python benches/run.py [--quick] [--python 3.11|all|3.9,3.13|/usr/bin/python3.11|current]
                          [--only overhead,hook,memory,snapshot,objects,instructions]
                          [--out results.md]

The first four parts (see their modules) compare the same workload untraced, under the
standard ``tracemalloc`` and under ``alloctrace``; the fifth (``objects``) measures what
``take_snapshot(objects=True)`` costs over a plain snapshot, which tracemalloc cannot do.
``--only instructions`` (not part of a plain run) counts the overhead part's workloads in
instructions under callgrind instead of timing them, for a busy machine (see ``instructions``).
By default each interpreter (a version found in pyenv or on ``PATH``, or one given by its path)
gets a venv under ``--cache`` with pyperformance and a release wheel of this checkout;
``--python current`` measures the running interpreter as installed.  The table goes to stdout
(and ``--out``); progress goes to stderr.  This is not part of the test suite's pass/fail: a MISS
is a finding, not an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import time
from pathlib import Path

import deep_memory
import environments
import hook
import instructions
import memory
import objects
import overhead
import report
import snapshot_ops

PARTS = {
    "overhead": overhead,
    "hook": hook,
    "memory": memory,
    "snapshot": snapshot_ops,
    "objects": objects,
    "instructions": instructions,
    "deep_memory": deep_memory,
}

#: Parts a plain run leaves out: ``instructions`` runs everything under valgrind (slow), for
#: comparing commits on a busy machine; ``deep_memory`` installs sympy into the venv. Ask for
#: them with ``--only``.
OPT_IN = ("instructions", "deep_memory")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benches/run.py", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    preset = parser.add_mutually_exclusive_group()
    preset.add_argument(
        "--quick", action="store_true", help="about a minute per part: one round, short values"
    )
    preset.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long run on tiny inputs, to check the harness works (figures meaningless)",
    )
    parser.add_argument(
        "--python",
        default=environments.DEFAULT_VERSION,
        help="interpreter(s): a version such as 3.11 or an interpreter's path (e.g. a "
        "distribution's /usr/bin/python3.11 beside pyenv's), a comma-separated list, 'all' "
        f"({', '.join(environments.SUPPORTED)}) or 'current' (this interpreter, no venv)",
    )
    parser.add_argument(
        "--only",
        default=",".join(name for name in PARTS if name not in OPT_IN),
        help=f"comma-separated parts to run, from {', '.join(PARTS)}",
    )
    parser.add_argument(
        "--nframes",
        help="comma-separated frame limits for the overhead part, overriding the preset's "
        "(e.g. --quick --nframes 1,25 for both depths in one round)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        help="interleaved rounds of the overhead part, overriding the preset's (e.g. --quick "
        "--rounds 3: each figure the median of three children, which a machine's passing "
        "slowdowns move less than one)",
    )
    parser.add_argument(
        "--benchmarks",
        help="comma-separated pyperformance benchmarks for the overhead and instructions parts "
        "(default: all of overhead.BENCHMARKS)",
    )
    parser.add_argument(
        "--no-memray",
        action="store_true",
        help="leave out the memray columns of the instructions part (memray is slow to start "
        "under valgrind)",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="also time alloctrace's native mode (start(1, native=True)) in the overhead part",
    )
    parser.add_argument(
        "--memray",
        action="store_true",
        help="also time memray (its Tracker, as `memray run`, with no option, "
        "--trace-python-allocators and --native) in the overhead part",
    )
    parser.add_argument(
        "--fidelity-cost",
        action="store_true",
        help="also time exact tracing at one frame without re-attributing objects reused from "
        "free lists (start(1, reattribute=False)) in the overhead part, beside the default",
    )
    parser.add_argument("--out", type=Path, help="also write the markdown to this file")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path.home() / ".cache" / "alloctrace-bench",
        help="where the per-interpreter venvs and wheels live",
    )
    alloc = parser.add_mutually_exclusive_group()
    alloc.add_argument(
        "--wheel", help="install this alloctrace wheel instead of building one from the checkout"
    )
    alloc.add_argument(
        "--no-alloctrace",
        action="store_true",
        help="measure untraced and tracemalloc only (the alloctrace column is left out)",
    )
    opts = parser.parse_args(argv)
    unknown = set(opts.only.split(",")) - set(PARTS)
    if unknown:
        parser.error(f"unknown part(s) in --only: {', '.join(sorted(unknown))}")
    if opts.rounds is not None and opts.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {opts.rounds}")
    if opts.benchmarks:
        known = {b.name for b in overhead.BENCHMARKS}
        wrong = set(opts.benchmarks.split(",")) - known
        if wrong:
            parser.error(f"unknown benchmark(s) in --benchmarks: {', '.join(sorted(wrong))}")
    return opts


def interpreters(spec: str) -> list[str]:
    """Expand --python into a list of versions and interpreter paths (or ["current"])."""
    if spec == "current":
        return ["current"]
    versions = list(environments.SUPPORTED) if spec == "all" else spec.split(",")
    for version in versions:
        if os.sep in version:
            environments.interpreter_path_version(version)
        elif version not in environments.SUPPORTED:
            raise SystemExit(
                f"unsupported --python {version!r}; expected one of "
                f"{', '.join(environments.SUPPORTED)}, an interpreter's path, 'all' or 'current'"
            )
    return versions


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    preset = "smoke" if opts.smoke else "quick" if opts.quick else "full"
    command = "python benches/run.py " + shlex.join(argv) if argv else "python benches/run.py"
    command = command.rstrip()
    if opts.no_alloctrace:
        alloctrace = "skip"
    else:
        alloctrace = opts.wheel or "build"
    sections = []
    for version in interpreters(opts.python):
        started = time.monotonic()
        if version == "current":
            python = environments.current_python()
        else:
            python = environments.prepare_venv(version, opts.cache, alloctrace)
        interp = environments.interpreter_facts(python)
        if opts.no_alloctrace:
            interp["alloctrace_problem"] = "left out with --no-alloctrace"
        with_at = not interp["alloctrace_problem"]
        facts = {
            "command": command,
            "preset": preset,
            "interpreter": interp,
            "machine": environments.machine_facts(),
            "commit": environments.git_commit(),
            "load_before": environments.load_average(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        results = {}
        extra = []
        for name in opts.only.split(","):
            module = PARTS[name]
            settings = module.PRESETS[preset]
            if opts.nframes and name == "overhead":
                nframes = tuple(int(n) for n in opts.nframes.split(","))
                settings = dataclasses.replace(settings, nframes=nframes)
            if opts.rounds is not None and name == "overhead":
                settings = dataclasses.replace(settings, rounds=opts.rounds)
            if name == "overhead" and (opts.native or opts.memray or opts.fidelity_cost):
                side = (
                    (overhead.NATIVE_MODES if opts.native else ())
                    + (overhead.FIDELITY_MODES if opts.fidelity_cost else ())
                    + (overhead.MEMRAY_MODES if opts.memray else ())
                )
                settings = dataclasses.replace(settings, extra=side)
            if opts.benchmarks and name in ("overhead", "instructions"):
                chosen = opts.benchmarks.split(",")
                benches = tuple(b for b in overhead.BENCHMARKS if b.name in chosen)
                settings = dataclasses.replace(settings, benchmarks=benches)
            if opts.no_memray and name == "instructions":
                settings = dataclasses.replace(settings, memray=False)
            if name in OPT_IN:
                extra.append((module, module.run(python, settings, with_at)))
            else:
                results[name] = module.run(python, settings, with_at)
        facts["load_after"] = environments.load_average()
        facts["wall"] = f"{(time.monotonic() - started) / 60:.1f} min"
        if results:
            sections.append(report.render(facts, results))
        sections += [module.render(facts, part) for module, part in extra]
    text = "\n".join(sections)
    sys.stdout.write(text)
    if opts.out:
        opts.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
