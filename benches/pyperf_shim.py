"""Running a pyperformance benchmark script inside the current process.

pyperformance's ``run_benchmark.py`` scripts hand their workload to ``pyperf.Runner``, which
re-executes the script in worker processes with a filtered environment.  A tracer started by the
harness would not survive that, so instead the script is executed here with ``pyperf.Runner``
replaced by :class:`RecordingRunner`, which only records what the script asked to benchmark.  The
harness then times the recorded callables itself, in this very process, where it can check that
the tracer is on.
"""

from __future__ import annotations

import argparse
import runpy
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass
class Workload:
    """One benchmark registered by a script: a pyperf ``bench_func`` or ``bench_time_func``."""

    name: str
    kind: str  # "func": call func(*args) once per loop; "time_func": func(loops, *args) -> s
    func: Callable[..., Any]
    args: tuple[Any, ...]
    inner_loops: int = 1

    def seconds_per_op(self, loops: int) -> float:
        """Run *loops* loops and return the time of one operation, as pyperf would report it."""
        if self.kind == "time_func":
            elapsed = self.func(loops, *self.args)
        else:
            func, args = self.func, self.args
            t0 = time.perf_counter()
            for _ in range(loops):
                func(*args)
            elapsed = time.perf_counter() - t0
        return elapsed / (loops * self.inner_loops)


@dataclass
class RecordingRunner:
    """Stands in for ``pyperf.Runner``: keeps the script's argument parsing, records workloads."""

    argv: list[str]
    workloads: list[Workload] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.metadata: dict[str, Any] = {}
        self.argparser = argparse.ArgumentParser()

    def parse_args(self, args: list[str] | None = None) -> argparse.Namespace:
        return self.argparser.parse_args(self.argv if args is None else args)

    def bench_func(self, name: str, func: Callable[..., Any], *args: Any, **kw: Any) -> None:
        self.workloads.append(Workload(name, "func", func, args, kw.get("inner_loops") or 1))

    def bench_time_func(self, name: str, func: Callable[..., Any], *args: Any, **kw: Any) -> None:
        self.workloads.append(Workload(name, "time_func", func, args, kw.get("inner_loops") or 1))


def load(script: Path, argv: list[str]) -> list[Workload]:
    """Execute a pyperformance benchmark script as ``__main__`` and return what it registered."""
    import pyperf

    runners: list[RecordingRunner] = []

    def make_runner(*_args: Any, **_kwargs: Any) -> RecordingRunner:
        runner = RecordingRunner(list(argv))
        runners.append(runner)
        return runner

    real_runner = pyperf.Runner
    pyperf.Runner = make_runner  # type: ignore[assignment]
    sys.path.insert(0, str(script.parent))  # scripts import sibling modules (regex_compile)
    saved_argv = sys.argv
    sys.argv = [str(script), *argv]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        pyperf.Runner = real_runner  # type: ignore[assignment]
        sys.argv = saved_argv
    workloads = [w for runner in runners for w in runner.workloads]
    if not workloads:
        raise RuntimeError(f"{script} registered no benchmark with pyperf.Runner")
    return workloads
