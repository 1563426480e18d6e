"""The tracing modes every benchmark is run under, as seen from inside a child process.

Each benchmark runs the same workload untraced, under the standard ``tracemalloc`` and under
``alloctrace``.  A mode is written as a short string so that it can travel on a child's command
line: ``none``, ``tracemalloc:25``, ``alloctrace:1``, ``alloctrace:64@524288`` for alloctrace's
sampled mode (one sample per 524288 bytes on average), ``alloctrace:1+native`` for its native
mode, ``alloctrace:64@524288+noreattribute`` for one that leaves objects reused from free lists
with their first traceback (``start(reattribute=False)``), and, for side-by-side columns,
``memray``, ``memray+python-allocators`` and ``memray+native``: memray's ``Tracker`` (what
``memray run`` runs the program under) with the options of ``memray run``,
``--trace-python-allocators`` and ``--native``, writing its capture file to a temporary
directory.  Keeping the start, stop and "is it really on?" logic
here means every part of the suite treats the tracers identically, and a result can never be
reported for a tracer that silently failed to start.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from types import ModuleType
from typing import Any

UNTRACED = "none"
TRACERS = ("tracemalloc", "alloctrace")
MEMRAY = "memray"
#: memray's modes: the option after "+" -> the ``memray.Tracker`` keyword arguments (those of
#: ``memray run`` and its ``--trace-python-allocators`` and ``--native`` flags).
MEMRAY_OPTIONS: dict[str, dict[str, bool]] = {
    "": {},
    "python-allocators": {"trace_python_allocators": True},
    "native": {"native_traces": True},
}
#: alloctrace's option for ``start(reattribute=False)``.
NO_REATTRIBUTE = "noreattribute"
#: The running memray tracker and its temporary directory, between start() and stop().
_memray: list[tuple[Any, str]] = []


def mode(
    tracer: str,
    nframe: int,
    sample_interval: int | None = None,
    native: bool = False,
    reattribute: bool = True,
) -> str:
    """Return the mode string for *tracer* capturing *nframe* frames per allocation, every
    allocation or (alloctrace only) one sample per *sample_interval* bytes, with (alloctrace
    only) its native mode, or without re-attributing objects reused from free lists."""
    if tracer not in TRACERS:
        raise ValueError(f"unknown tracer {tracer!r}; expected one of {TRACERS}")
    if (sample_interval is not None or native or not reattribute) and tracer != "alloctrace":
        raise ValueError(f"{tracer} has no sampled or native mode and always re-attributes")
    if native and not reattribute:
        raise ValueError("one option per mode: native or noreattribute")
    spec = f"{tracer}:{nframe}"
    if sample_interval is not None:
        spec += f"@{sample_interval}"
    if not reattribute:
        spec += "+" + NO_REATTRIBUTE
    return spec + ("+native" if native else "")


def memray_mode(option: str = "") -> str:
    """Return the mode string of memray with *option* (a key of MEMRAY_OPTIONS)."""
    if option not in MEMRAY_OPTIONS:
        known = list(MEMRAY_OPTIONS)
        raise ValueError(f"unknown memray option {option!r}; expected one of {known}")
    return MEMRAY + (f"+{option}" if option else "")


def sample_interval(spec: str) -> int | None:
    """The sampling interval of a mode string, None for exact tracing."""
    _, _, interval = spec.partition("+")[0].partition("@")
    return int(interval) if interval else None


def is_native(spec: str) -> bool:
    """Whether a mode string asks for alloctrace's native mode."""
    return spec.startswith("alloctrace:") and spec.endswith("+native")


def reattributes(spec: str) -> bool:
    """Whether a mode string leaves alloctrace's re-attribution of reused objects on."""
    return not (spec.startswith("alloctrace:") and spec.endswith("+" + NO_REATTRIBUTE))


def parse(spec: str) -> tuple[str | None, int]:
    """Split a mode string into (tracer name or None, nframe); memray's nframe is 0 (it keeps
    whole stacks)."""
    if spec == UNTRACED:
        return None, 0
    base, plus, option = spec.partition("+")
    if base == MEMRAY:
        if (plus and not option) or option not in MEMRAY_OPTIONS:
            raise ValueError(f"bad memray mode {spec!r}; expected one of {_memray_modes()}")
        return MEMRAY, 0
    base, at, interval = base.partition("@")
    tracer, sep, nframe = base.partition(":")
    if tracer not in TRACERS or not sep or not nframe.isdigit() or int(nframe) < 1:
        raise ValueError(f"bad tracing mode {spec!r}; expected 'none' or 'TRACER:NFRAME'")
    if at and (tracer != "alloctrace" or not interval.isdigit() or int(interval) < 1):
        raise ValueError(f"bad sampled mode {spec!r}; expected 'alloctrace:NFRAME@BYTES'")
    if plus and (tracer != "alloctrace" or option not in ("native", NO_REATTRIBUTE)):
        raise ValueError(
            f"bad mode option in {spec!r}; expected 'alloctrace:NFRAME+native' or "
            f"'alloctrace:NFRAME[@BYTES]+{NO_REATTRIBUTE}'"
        )
    return tracer, int(nframe)


def _memray_modes() -> list[str]:
    return [memray_mode(option) for option in MEMRAY_OPTIONS]


def module(spec: str) -> ModuleType | None:
    """Import and return the tracer module a mode uses (None when untraced, and for memray,
    which has no tracemalloc-like API to ask)."""
    tracer, _ = parse(spec)
    return None if tracer in (None, MEMRAY) else importlib.import_module(tracer)


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
    if tracer == MEMRAY:
        _start_memray(spec)
        check(spec)
        return
    mod = importlib.import_module(tracer)
    options: dict[str, Any] = {}
    interval = sample_interval(spec)
    if interval is not None:
        options["sample_interval"] = interval
    if is_native(spec):
        options["native"] = True
    if not reattributes(spec):
        options["reattribute"] = False
    mod.start(nframe, **options)
    check(spec)


def _start_memray(spec: str) -> None:
    import memray

    option = spec.partition("+")[2]
    directory = tempfile.mkdtemp(prefix="alloctrace-bench-memray-")
    tracker = memray.Tracker(os.path.join(directory, "capture.bin"), **MEMRAY_OPTIONS[option])
    tracker.__enter__()
    _memray.append((tracker, directory))


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
            native = getattr(mod, "is_tracing_native", lambda: False)()
            if native != is_native(spec):
                raise RuntimeError(f"alloctrace native mode is {native} under {spec!r}")
            if not reattributes(spec) and getattr(mod, "is_reattributing", lambda: True)():
                raise RuntimeError(f"alloctrace re-attributes reused objects under {spec!r}")
    if bool(_memray) != (tracer == MEMRAY):
        state = "is not" if tracer == MEMRAY else "is unexpectedly"
        raise RuntimeError(f"memray {state} tracking under {spec!r}")


def stop(spec: str) -> None:
    """Stop the mode's tracer (no-op when untraced); memray's capture file is deleted."""
    if _memray:
        tracker, directory = _memray.pop()
        tracker.__exit__(None, None, None)
        shutil.rmtree(directory, ignore_errors=True)
    mod = module(spec)
    if mod is not None:
        mod.stop()
