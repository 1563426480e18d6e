"""The tracing modes every benchmark is run under, as seen from inside a child process.

Each benchmark runs the same workload untraced, under the standard ``tracemalloc`` and under
``alloctrace``.  A mode is written as a short string so that it can travel on a child's command
line: ``none``, ``tracemalloc:25``, ``alloctrace:1``, or ``alloctrace:64@524288`` for alloctrace's
sampled mode (one sample per 524288 bytes on average).  Keeping the start, stop and "is it really
on?" logic here means every part of the suite treats the two tracers identically, and a result can
never be reported for a tracer that silently failed to start.
"""

from __future__ import annotations

import importlib
from types import ModuleType

UNTRACED = "none"
TRACERS = ("tracemalloc", "alloctrace")


def mode(tracer: str, nframe: int, sample_interval: int | None = None) -> str:
    """Return the mode string for *tracer* capturing *nframe* frames per allocation, every
    allocation or (alloctrace only) one sample per *sample_interval* bytes."""
    if tracer not in TRACERS:
        raise ValueError(f"unknown tracer {tracer!r}; expected one of {TRACERS}")
    if sample_interval is not None:
        if tracer != "alloctrace":
            raise ValueError(f"{tracer} has no sampled mode")
        return f"{tracer}:{nframe}@{sample_interval}"
    return f"{tracer}:{nframe}"


def sample_interval(spec: str) -> int | None:
    """The sampling interval of a mode string, None for exact tracing."""
    _, _, interval = spec.partition("@")
    return int(interval) if interval else None


def parse(spec: str) -> tuple[str | None, int]:
    """Split a mode string into (tracer module name or None, nframe)."""
    if spec == UNTRACED:
        return None, 0
    spec, at, interval = spec.partition("@")
    tracer, sep, nframe = spec.partition(":")
    if tracer not in TRACERS or not sep or not nframe.isdigit() or int(nframe) < 1:
        raise ValueError(f"bad tracing mode {spec!r}; expected 'none' or 'TRACER:NFRAME'")
    if at and (tracer != "alloctrace" or not interval.isdigit() or int(interval) < 1):
        raise ValueError(f"bad sampled mode {spec!r}; expected 'alloctrace:NFRAME@BYTES'")
    return tracer, int(nframe)


def module(spec: str) -> ModuleType | None:
    """Import and return the tracer module a mode uses (None when untraced)."""
    tracer, _ = parse(spec)
    return None if tracer is None else importlib.import_module(tracer)


def alloctrace_status() -> str | None:
    """Return None when ``alloctrace`` imports, else a one-line reason it cannot be measured."""
    try:
        mod = importlib.import_module("alloctrace")
    except ImportError as exc:
        return f"alloctrace is not importable ({exc})"
    missing = [
        name
        for name in ("start", "stop", "is_tracing", "get_tracemalloc_memory", "get_traced_memory")
        if not hasattr(mod, name)
    ]
    if missing:
        return f"alloctrace lacks {', '.join(missing)} (tracer not built into this install)"
    return None


def start(spec: str) -> None:
    """Start the mode's tracer and fail loudly unless it reports itself as tracing."""
    tracer, nframe = parse(spec)
    for name in TRACERS:
        # A stray PYTHONTRACEMALLOC (or an earlier test) must not make "untraced" runs traced.
        try:
            other = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(other, "is_tracing", lambda: False)():
            raise RuntimeError(f"{name} was already tracing before mode {spec!r} started")
    if tracer is None:
        return
    mod = importlib.import_module(tracer)
    interval = sample_interval(spec)
    if interval is None:
        mod.start(nframe)
    else:
        mod.start(nframe, sample_interval=interval)
    check(spec)


def check(spec: str) -> None:
    """Raise unless exactly the mode's tracer (and no other) is tracing right now."""
    tracer, _ = parse(spec)
    for name in TRACERS:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            if name == tracer:
                raise
            continue
        on = bool(getattr(mod, "is_tracing", lambda: False)())
        if on != (name == tracer):
            state = "is not" if name == tracer else "is unexpectedly"
            raise RuntimeError(f"{name} {state} tracing under mode {spec!r}")
        if on and name == "alloctrace":
            interval = getattr(mod, "get_sample_interval", lambda: None)()
            if interval != sample_interval(spec):
                raise RuntimeError(f"alloctrace samples every {interval} bytes under {spec!r}")


def stop(spec: str) -> None:
    """Stop the mode's tracer (no-op when untraced)."""
    mod = module(spec)
    if mod is not None:
        mod.stop()
