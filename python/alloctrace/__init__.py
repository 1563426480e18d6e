"""Trace memory allocations, like :mod:`tracemalloc`, at a fraction of its cost.

``alloctrace`` is a drop-in replacement for the standard :mod:`tracemalloc`
module: the same functions, classes, results, reprs and sort orders. Where a
program says ``import tracemalloc``, it can say ``import alloctrace as
tracemalloc`` and get the same answers, many times faster::

    import alloctrace
    alloctrace.start(25)
    ...
    snapshot = alloctrace.take_snapshot()
    for stat in snapshot.statistics("lineno")[:10]:
        print(stat)

The hooks record raw stacks and resolve line numbers only when a snapshot or
traceback is requested; the analysis (grouping, diffing, filtering, dump and
load) runs in Rust.
"""

from __future__ import annotations

import linecache  # noqa: F401  (tracemalloc exposes it; tests patch linecache.getline through it)
import os as _os

from alloctrace import _memory_limit, _native, _retention
from alloctrace._capture import Capture, combined_statistics, load_capture, merge_snapshots
from alloctrace._native import (
    NATIVE_DOMAIN,
    SnapshotFormatError,
    clear_traces,
    disable,
    enable,
    get_traceback_limit,
    get_traced_memory,
    get_tracemalloc_memory,
    is_enabled,
    is_reattributing,
    is_tracing,
    is_tracing_native,
    reset_peak,
    set_traceback_limit,
    stop,
)
from alloctrace._native import get_object_traceback as _get_object_traceback
from alloctrace._native import get_traces as _get_traces
from alloctrace._process import ProcessMemory, get_process_memory
from alloctrace._retention import (
    Edge,
    ReferrerPath,
    Retention,
    referrer_paths,
    retained_size,
    retention,
)
from alloctrace._snapshot import (
    BaseFilter,
    DomainFilter,
    Filter,
    Frame,
    SiteRetention,
    Snapshot,
    Statistic,
    StatisticDiff,
    Trace,
    Traceback,
    _format_size,
)

__all__ = [
    "NATIVE_DOMAIN",
    "BaseFilter",
    "Capture",
    "DomainFilter",
    "Edge",
    "Filter",
    "Frame",
    "ProcessMemory",
    "ReferrerPath",
    "Retention",
    "SiteRetention",
    "Snapshot",
    "SnapshotFormatError",
    "Statistic",
    "StatisticDiff",
    "Trace",
    "Traceback",
    "add_filter",
    "clear_filters",
    "clear_traces",
    "combined_statistics",
    "disable",
    "enable",
    "get_filters",
    "get_object_traceback",
    "get_process_memory",
    "get_push_status",
    "get_sample_interval",
    "get_traceback_limit",
    "get_traced_memory",
    "get_tracemalloc_memory",
    "is_enabled",
    "is_reattributing",
    "is_tracing",
    "is_tracing_native",
    "load_capture",
    "merge_snapshots",
    "referrer_paths",
    "reset_peak",
    "retained_size",
    "retention",
    "set_traceback_limit",
    "start",
    "start_push",
    "stop",
    "stop_push",
    "take_snapshot",
]

__version__ = "0.1.0"

# tracemalloc's private names, for code (and tests) written against them.
_Frame = Frame
_format_size = _format_size


def start(
    nframe: int = 1,
    *,
    sample_interval: int | None = None,
    sample_seed: int | None = None,
    native: bool | None = None,
    reattribute: bool | None = None,
    memory_limit: int | str | None = None,
    memory_limit_dump: str | _os.PathLike | None = None,
    push: str | None = None,
) -> None:
    """Start tracing Python memory allocations.

    Install hooks on the Python memory allocators. Collected tracebacks of
    traces are limited to *nframe* frames (1 to 65535). Does nothing if
    tracing is already on. The standard :mod:`tracemalloc` module may be
    tracing already (``-X tracemalloc``), or be started later by the program,
    a test suite or a library: both then trace, each with the answers it
    gives alone. Raises :exc:`RuntimeError` if tracemalloc traces under
    another tool's allocator hook.

    By default every allocation is traced (exact mode). With
    *sample_interval*, a number of bytes (1 to 2**40; ``None`` or ``0`` mean
    exact), only a sample is: one sampling point per *sample_interval* bytes
    allocated on average, drawn per thread, so a block of ``size`` bytes is
    recorded with probability ``1 - exp(-(size + 1) / sample_interval)``.
    Snapshots then say they are sampled (:attr:`Snapshot.sample_interval`)
    and every figure derived from them, like :func:`get_traced_memory`, is an
    unbiased estimate of the true one. 512 KiB (``524288``) costs a few
    percent at most; see the README. *sample_seed* (0 to 2**64-1) makes the
    choice of samples reproducible for a single-threaded program; by default
    the seed is fresh each time.

    While tracing, asking for a different *sample_interval* or for a
    *sample_seed* raises :exc:`RuntimeError`: call :func:`stop` first.

    With *native* true, the ``malloc`` family and anonymous ``mmap`` calls
    that extension modules (and the shared libraries they load) make
    themselves, directly or through allocator pointers the loader stored in
    their data (libxml2's ``xmlMalloc`` in lxml), are traced too, in their
    own domain, :data:`NATIVE_DOMAIN`
    (``DomainFilter(True, "native")`` selects them). The interpreter's own
    allocations are not counted twice. ``None`` means off, or whatever is
    running when already tracing; asking for the other mode while tracing
    raises :exc:`RuntimeError`. See docs/native.md for what cannot be seen.

    CPython builds many objects (floats, tuples, lists, dicts...) in blocks
    taken from free lists of dead objects, not from the allocator. Such a
    block is moved to the traceback of the object now built in it, as
    :mod:`tracemalloc` does (:func:`is_reattributing` says whether it is).
    With *reattribute* false it keeps the traceback of its first allocation
    instead (as in memray): every object created then costs nothing, which
    matters most in sampled mode, where that per-object step is most of
    what is left (a few percent on programs that create many floats; see
    docs/sampling.md), but lines that reuse blocks are under-counted and the
    lines that first allocated them over-counted. ``None`` means on, or
    whatever is running when already tracing; asking for the other while
    tracing raises :exc:`RuntimeError`.

    With *memory_limit*, a snapshot with its peak (see :func:`take_snapshot`)
    is written to *memory_limit_dump* (a path; ``{pid}`` and ``{time}`` are
    replaced) once, when the limit is first reached or a :exc:`MemoryError`
    goes uncaught, and the program runs on; a line on stderr gives the path.
    *memory_limit* is an int (bytes of traced memory, as
    :func:`get_traced_memory` counts them) or a str in the forms of
    ``ALLOCTRACE_MEMORY_LIMIT``: ``'512MiB'`` or ``'traced:512MiB'``,
    ``'rss:2GiB'`` (the process's peak RSS), ``'cgroup:0.9'`` (the peak RSS
    against that fraction of the cgroup's memory limit), comma-separated. A
    watcher thread writes the snapshot, up to 10 ms after the crossing (plus
    its wait for the GIL); it ends with :func:`stop` (and a later
    :func:`start` without a limit). It cannot be given while tracing
    (:exc:`RuntimeError`: call :func:`stop` first).

    With *push*, the URL of a Pyroscope-compatible server, a memory profile
    of the process is pushed there every 15 seconds and at exit, as
    :func:`start_push` does (its other settings from the ``ALLOCTRACE_PUSH_*``
    variables); *sample_interval* then defaults to 512 KiB.
    """
    if push is not None:
        from alloctrace import _push

        _push.settings(push)  # a bad URL or variable is refused before tracing starts
        if sample_interval is None and not is_tracing():
            sample_interval = _push.DEFAULT_SAMPLE_INTERVAL
    limit = None
    if memory_limit is not None or memory_limit_dump is not None:
        from alloctrace import _startup

        limit = _startup.memory_limit_in_code(memory_limit, memory_limit_dump)
        if is_tracing():
            raise RuntimeError("memory_limit cannot be set while tracing: call stop() first")
    elif not is_tracing():
        # A limit set with an earlier start() ends, even if its watcher has not seen the stop.
        _memory_limit.deactivate()
    _native.start(
        nframe,
        sample_interval=sample_interval,
        sample_seed=sample_seed,
        native=native,
        reattribute=reattribute,
    )
    if limit is not None:
        limit.install()
    if push is not None:
        from alloctrace import _push

        if _push._pusher is None or _push._pusher._closed:
            start_push(push)


def start_push(
    url: str,
    *,
    interval: float | None = None,
    timeout: float | None = None,
    service: str | None = None,
    tags: dict[str, str] | None = None,
    user: str | None = None,
    password: str | None = None,
    token: str | None = None,
    tenant: str | None = None,
) -> None:
    """Push a memory profile of this process to a Pyroscope-compatible server.

    Every *interval* seconds (default 15) and once at exit (or at
    :func:`stop_push`), a background thread takes a snapshot of what is
    traced now (holding the GIL only for that) and sends it as a pprof heap
    profile to *url*: ``inuse_space``/``inuse_objects`` for what is alive, and
    ``alloc_space``/``alloc_objects`` for what was allocated since the
    previous profile (counted by the hooks only while pushing), e.g.
    ``http://localhost:4040`` or ``https://USER:TOKEN@profiles-prod-001.grafana.net``:
    Pyroscope's Connect push API first, its ``/ingest`` API if the server
    shows it does not speak Connect. Tracing must be on (:func:`start`,
    best sampled, e.g. ``sample_interval=512 * 1024``); while it is off,
    no profile is taken.

    Labels: ``service_name`` (*service*, default the program's name),
    ``host``, ``pid``, ``process.runtime.*``, ``alloctrace_version`` and
    *tags* (a dict; names of letters, digits, ``_`` and ``.``). Auth: basic
    (*user*, *password*, or the URL's user info), a bearer *token*, and a
    *tenant* (``X-Scope-OrgID``). Each argument left ``None`` comes from its
    variable (``ALLOCTRACE_PUSH_INTERVAL``, ``ALLOCTRACE_PUSH_TIMEOUT``,
    ``ALLOCTRACE_SERVICE``, ``ALLOCTRACE_TAGS``, ``ALLOCTRACE_PUSH_USER``,
    ``ALLOCTRACE_PUSH_PASSWORD``, ``ALLOCTRACE_PUSH_TOKEN``,
    ``ALLOCTRACE_PUSH_TENANT``). Requests time out after *timeout* seconds
    (default 5).

    A server that is down, slow or failing never reaches the program: one
    line on stderr at the first failure, then quiet retries with backoff, at
    most 8 profiles waiting (the oldest dropped). A forked child pushes its
    own profiles under its own ``pid``. Raises :exc:`ValueError` for a bad
    setting, :exc:`RuntimeError` if already pushing. See docs/push.md.
    """
    from alloctrace import _push

    _push.start_push(
        url,
        interval=interval,
        timeout=timeout,
        service=service,
        tags=tags,
        user=user,
        password=password,
        token=token,
        tenant=tenant,
    )


def stop_push(final: bool = True) -> None:
    """Stop pushing profiles; with *final* (the default), push a last one first, waiting
    at most the push timeout (not if the server's last answer was a failure)."""
    from alloctrace import _push

    _push.stop_push(final)


def get_push_status() -> dict | None:
    """The pusher's counters: ``url`` (without credentials), ``api`` (``'connect'`` or
    ``'ingest'``), ``pushed``, ``failed``, ``dropped``, ``queued``, ``last_error``,
    ``snapshot_seconds_last`` and ``snapshot_seconds_max`` (the wall time of taking a
    profile's snapshot, the part that holds the GIL) and ``thread_cpu_seconds`` (the CPU time
    of the pusher's thread: snapshots, profiles, compression, requests); ``None`` if this
    process never pushed."""
    from alloctrace import _push

    return _push.get_push_status()


def get_sample_interval() -> int | None:
    """Return the sampling interval in bytes while tracing in sampled mode.

    Return ``None`` when tracing exactly or not tracing.
    """
    return _native.get_sample_interval()


def _check_count(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, not {value}")


def get_object_traceback(obj):
    """Get the traceback where the Python object *obj* was allocated.

    Return a :class:`Traceback` instance, or ``None`` if the module is not
    tracing memory allocations or did not trace the allocation of the object.
    """
    frames = _get_object_traceback(obj)
    if frames is None:
        return None
    return Traceback(frames)


def take_snapshot(
    objects: bool = False,
    *,
    retention: int = 0,
    baseline=None,
    retention_limit: int = 3,
    peak: bool = False,
) -> Snapshot:
    """Take a snapshot of the traces of memory blocks allocated by Python.

    With *peak* true, the snapshot is of the moment the traced memory last reached its
    peak (``get_traced_memory()[1]``) since :func:`start`, :func:`clear_traces` or
    :func:`reset_peak`, even if that memory is freed now: per traceback, the exact bytes and
    blocks alive then (estimates with the same weights as :func:`get_traced_memory` when
    sampling). Its traces are one per traceback, each the total of its blocks
    (:attr:`Snapshot.is_peak`); statistics, comparisons, filters, dumps and exports work on
    it as on any snapshot. What cannot be known for a past moment is absent: block
    addresses (so :func:`get_object_traceback`), object kinds (*objects*) and retention.

    With *objects* true, also record what each traced block is (its object kind: the
    object's type, a buffer named after its owner's type such as ``'list (items)'``, or
    ``'raw'``) by walking the live objects, so the snapshot can be grouped by ``'type'``
    and ``'lineno+type'``. The walk's cost grows with the number of live objects.

    With *retention* > 0, also explain why the objects of the *retention* largest
    allocation sites (by the most recent frame, as ``statistics('lineno')`` groups them)
    are alive, or of the sites that grew most since the snapshot *baseline* when given:
    per site, what holds its objects (grouped by the holders' type and allocation site),
    up to *retention_limit* sample reference chains and the retained size. Read them with
    :meth:`Snapshot.referrer_paths`; they are saved by :meth:`Snapshot.dump`. This walks
    the whole heap once more (about a second per million objects).

    Raises :exc:`RuntimeError` if the module is not tracing.
    """
    # Until the traces are read, nothing here may create an object (a tuple of the arguments,
    # a call through a type such as bool() on 3.9, a Python call's frame on 3.9 and 3.10): it
    # would take a block off a free list and charge it to this file, where tracemalloc's
    # snapshot leaves it on the line that last made it.
    if (
        isinstance(retention, bool)
        or not isinstance(retention, int)
        or retention < 0
        or isinstance(retention_limit, bool)
        or not isinstance(retention_limit, int)
        or retention_limit < 0
    ):
        _check_count("retention", retention)
        _check_count("retention_limit", retention_limit)
    if peak and (objects or retention):
        raise ValueError(
            "take_snapshot(peak=True) takes neither objects nor retention: the objects alive "
            "at the peak may be gone"
        )
    if baseline is not None and not isinstance(baseline, Snapshot):
        raise TypeError(f"baseline must be a Snapshot, not {type(baseline).__name__}")
    if not is_tracing():
        raise RuntimeError(
            "the tracemalloc module must be tracing memory allocations to take a snapshot"
        )
    if _get_traces is _native.get_traces:
        # The fast path: traces go from the live table to the snapshot without ever
        # becoming Python tuples.
        # Read first: the bound method Snapshot._from_data is an object too.
        data = _native.take_snapshot(True if objects else False, True if peak else False)
        snapshot = Snapshot._from_data(data)
    elif peak:
        data = _native.take_snapshot(False, True)
        return Snapshot._from_data(data)
    else:
        if objects:
            raise RuntimeError(
                "take_snapshot(objects=True) cannot be used with a replaced _get_traces"
            )
        # `_get_traces` was replaced (as tracemalloc's own tests do): honour the replacement.
        snapshot = Snapshot(_get_traces(), get_traceback_limit())
    if retention:
        reports = _retention._capture(snapshot, retention, baseline, retention_limit)
        snapshot._data = snapshot._data.with_retention(reports)
    return snapshot


# Trace-time filters, in the order they were added (the native side holds them compiled).
_trace_filters: list = []


def add_filter(filter) -> None:
    """Add a trace-time filter: allocations it rejects are never recorded.

    *filter* is a :class:`Filter` or :class:`DomainFilter`, with the same
    matching rules as :meth:`Snapshot.filter_traces`: a new allocation is
    recorded if it matches any inclusive filter (when there is one) and every
    exclusive filter. Filters apply to allocations made from now on, cost no
    pattern matching for a call stack already judged, and survive
    :func:`stop`/:func:`start`. This is how to cut the tracer's cost and
    memory in a large program: ``add_filter(Filter(True, "*/myapp/*",
    all_frames=True))``.
    """
    if not isinstance(filter, BaseFilter):
        raise TypeError(
            f"add_filter() expects a Filter or DomainFilter, not {type(filter).__name__}"
        )
    specs = [f._spec() for f in _trace_filters] + [filter._spec()]
    _native.set_trace_filters(specs)
    _trace_filters.append(filter)


def get_filters() -> list:
    """Return the trace-time filters, as a new list, in the order they were added."""
    return list(_trace_filters)


def clear_filters() -> None:
    """Remove every trace-time filter: record all allocations again."""
    _native.set_trace_filters([])
    _trace_filters.clear()


def load_ipython_extension(ipython) -> None:
    """Register the ``%%alloctrace`` cell magic: ``%load_ext alloctrace`` in IPython or
    Jupyter (see :mod:`alloctrace._ipython`)."""
    from alloctrace._ipython import load_ipython_extension as load

    load(ipython)


_NO_ARGUMENT = object()


def _trace_alongside_tracemalloc() -> None:
    """Let the standard ``tracemalloc`` start and stop while alloctrace traces.

    ``tracemalloc.start()`` wraps whatever allocators are in place, and allocates its own
    tables through them; ``tracemalloc.stop()`` puts them back. Called bare, it would wrap
    alloctrace's hooks, which would then count tracemalloc's tables as the program's. So the
    two functions are wrapped: around the standard ones, the native module moves its hooks
    above tracemalloc's, and back (see ``src/hooks/alongside.rs``). Both tracers then give the
    answers each gives alone.
    """
    import _tracemalloc

    original_start = _tracemalloc.start
    original_stop = _tracemalloc.stop
    if getattr(original_start, "_alloctrace_alongside", False):
        return

    # No *args tuple or **kwargs dict: made before tracemalloc's hooks go in and dropped
    # after, they would sit untraced on the free lists, and the program's next tuple and
    # dicts would then be missing from tracemalloc's traces.
    def start(nframe=_NO_ARGUMENT, /, *more):
        alongside = is_tracing() and not _tracemalloc.is_tracing()
        if alongside:
            _native._tracemalloc_starting()
        try:
            if more:
                return original_start(nframe, *more)
            if nframe is _NO_ARGUMENT:
                return original_start()
            return original_start(nframe)
        finally:
            if alongside:
                _native._tracemalloc_started()

    def stop():
        alongside = _native._tracemalloc_stopping()
        try:
            return original_stop()
        finally:
            if alongside:
                _native._tracemalloc_stopped()

    for wrapper, original in ((start, original_start), (stop, original_stop)):
        wrapper._alloctrace_alongside = True
        wrapper.__doc__ = original.__doc__
        wrapper.__qualname__ = wrapper.__name__
        wrapper.__module__ = original.__module__
    _tracemalloc.start = start
    _tracemalloc.stop = stop
    import sys

    stdlib = sys.modules.get("tracemalloc")
    if stdlib is not None:
        if getattr(stdlib, "start", None) is original_start:
            stdlib.start = start
        if getattr(stdlib, "stop", None) is original_stop:
            stdlib.stop = stop


#: What the standard formatter says of a warning's object while tracemalloc does not trace.
_TRACEMALLOC_HINT = "Enable tracemalloc to get the object allocation traceback"


def _allocation_lines_in_warnings() -> None:
    """Have warnings about an object (``ResourceWarning``: an unclosed file, socket or
    subprocess) say where the object was allocated while alloctrace traces.

    The standard formatter asks ``tracemalloc`` only: it adds "Object allocated at (most
    recent call last):" and the frames while that module traces, and otherwise "Enable
    tracemalloc to get the object allocation traceback". ``python -X alloctrace`` is meant
    to give what ``python -X tracemalloc`` gives, so while alloctrace traces the hint is
    replaced by the same lines, from :func:`get_object_traceback`; an object allocated
    before tracing started gets neither, as under ``tracemalloc``. Warnings formatted
    anywhere else (a replaced ``warnings.formatwarning``) are left alone. The formatter is
    changed when the program imports :mod:`warnings` (CPython does on the first warning with
    an object), not by importing it here (see :mod:`alloctrace._after_import`).
    """
    from alloctrace._after_import import when_imported

    when_imported("warnings", _add_allocation_lines)


def _add_allocation_lines(warnings) -> None:
    """Wrap the formatter of the just imported *warnings* (see above)."""
    original = getattr(warnings, "_formatwarnmsg_impl", None)
    if original is None or getattr(original, "_alloctrace_lines", False):
        return

    def _formatwarnmsg_impl(msg):
        text = original(msg)
        if msg.source is None:
            return text
        hint = f"{msg.category.__name__}: {_TRACEMALLOC_HINT}\n"
        try:
            if not text.endswith(hint) or not is_tracing():
                return text
            traceback = get_object_traceback(msg.source)
        except Exception:
            # Formatting a warning must not raise; at shutdown the tracer may be gone.
            return text
        text = text[: -len(hint)]
        if traceback is None:
            return text
        lines = ["Object allocated at (most recent call last):\n"]
        for frame in traceback:
            lines.append(f'  File "{frame.filename}", lineno {frame.lineno}\n')
            try:
                source = linecache.getline(frame.filename, frame.lineno).strip()
            except Exception:
                source = ""
            if source:
                lines.append(f"    {source}\n")
        return text + "".join(lines)

    _formatwarnmsg_impl._alloctrace_lines = True
    _formatwarnmsg_impl.__doc__ = original.__doc__
    warnings._formatwarnmsg_impl = _formatwarnmsg_impl


_trace_alongside_tracemalloc()
_allocation_lines_in_warnings()
