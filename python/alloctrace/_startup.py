"""Tracing from interpreter start-up, and snapshots written at exit and on an interval.

``alloctrace_startup.pth`` in site-packages calls :func:`install` while :mod:`site` runs, before
the first line of the program, but only when one of the variables below or ``-X alloctrace`` is
set; otherwise this module is never imported and costs nothing.

``ALLOCTRACE=NFRAME`` / ``-X alloctrace[=NFRAME]``
    Start tracing with NFRAME frames per traceback, like ``PYTHONTRACEMALLOC`` and
    ``-X tracemalloc``: empty means unset, ``0`` means no tracing, a bare ``-X alloctrace`` means
    1 frame, and the option wins over the variable. ``-E`` and ``-I`` ignore the variables.
    Like ``-X tracemalloc``, the option is passed on to the interpreters :mod:`multiprocessing`
    starts (``spawn``, ``forkserver``); children inherit the variables.
``ALLOCTRACE_DUMP=PATH``
    Write a snapshot to PATH when the process exits (normal end, ``sys.exit``, an uncaught
    exception, SIGTERM). A SIGTERM or SIGINT that arrives while that snapshot is written is
    held until it is in place; then the process dies of that signal (see
    :meth:`Dumper.dump_at_exit`). Implies ``ALLOCTRACE=1`` when tracing is not otherwise configured.
    ``{pid}``, ``{time}`` and ``{n}`` in PATH are replaced (see :func:`expand_path`).
``ALLOCTRACE_CAPTURE=DIR``
    Instead of ``ALLOCTRACE_DUMP``: every process of the program (forked children,
    :mod:`multiprocessing` workers with any start method, Python subprocesses, which inherit
    the variable) writes its snapshots into the directory DIR, named after its process id and
    start time, and records its start, its snapshots, its end and the exit status of the
    children it reaps in ``DIR/manifest.jsonl`` (see :mod:`alloctrace._capture`). The
    settings below that need ``ALLOCTRACE_DUMP`` work with it too. Implies ``ALLOCTRACE=1``
    when tracing is not otherwise configured; setting both is a configuration error.
``ALLOCTRACE_CAPTURE_KEEP=N``
    With ``ALLOCTRACE_CAPTURE``: at most N ended processes (besides the first, the top of the
    tree) keep their snapshot files in the capture (default
    :data:`alloctrace._capture.DEFAULT_KEEP`, 100; ``0``: no bound). Beyond that, as each
    process ends, the files of the earliest-ended child of the parent with the most ended
    children are removed; the manifest keeps that process's line and figures at exit (see
    :meth:`alloctrace._capture.Recorder.prune`), so a server that recycles its workers
    leaves a capture of bounded size.
``ALLOCTRACE_INTERVAL=SECONDS``
    With ``ALLOCTRACE_DUMP``, also write numbered snapshots every SECONDS (at least
    :data:`MIN_INTERVAL`, 0.1) from a daemon thread. Each numbered snapshot (these, and those
    of ``ALLOCTRACE_SIGNAL`` and ``ALLOCTRACE_MEMORY_LIMIT``) carries the peak of its
    interval, since the previous one, and the peak starts afresh after it (the program's own
    ``get_traced_memory()[1]`` and ``take_snapshot(peak=True)`` too); the exit snapshot
    carries the peak of the whole run.
``ALLOCTRACE_SAMPLE_INTERVAL=BYTES``
    Trace in sampled mode, one sample per BYTES allocated on average (see
    :func:`parse_size` for the accepted forms, e.g. ``524288``, ``512KiB``, ``512k``, ``2MiB``;
    ``0`` means exact tracing). Implies ``ALLOCTRACE=1`` when tracing is not otherwise
    configured.
``ALLOCTRACE_SAMPLE_SEED=N``
    Seed the sampler (an integer from 0 to 2**64-1) so that a run samples the same
    allocations every time; only with ``ALLOCTRACE_SAMPLE_INTERVAL``.
``ALLOCTRACE_OBJECTS=1``
    With ``ALLOCTRACE_DUMP``, the snapshots also record object kinds (as
    ``take_snapshot(objects=True)``), for ``alloctrace stats --key type``, and retention
    reports for ``alloctrace why``: for the top sites by size in the first snapshot a process
    writes, then for the sites that grew most since its previous one (as
    ``take_snapshot(retention=N, baseline=previous)``). ``0`` or empty: off.
``ALLOCTRACE_NATIVE=1``
    Also trace the ``malloc`` family and anonymous ``mmap`` calls that extension modules make
    themselves (as ``start(native=True)``), in the ``native`` domain. ``0`` or empty: off.
    Implies ``ALLOCTRACE=1`` when tracing is not otherwise configured.
``ALLOCTRACE_REATTRIBUTE=0``
    Leave objects that CPython builds in blocks from its free lists with the traceback of the
    block's first allocation (as ``start(reattribute=False)``); ``1`` or empty: re-attribute
    them, as ``tracemalloc`` does. Only a setting of the tracing the variables above start: it
    starts nothing by itself.
``ALLOCTRACE_RETENTION=N``
    With ``ALLOCTRACE_OBJECTS=1``, the number of sites that get a retention report in each
    dump (default :data:`RETENTION_SITES`; ``0``: object kinds only, no heap walk for reports).

The ``alloctrace`` command itself (its console script and ``python -m alloctrace``) is never
traced, whatever is set: the variables it inherits are meant for the programs the user traces,
and ``alloctrace run`` passes its child the settings of its own options.

``ALLOCTRACE_MEMORY_LIMIT=LIMIT``
    With ``ALLOCTRACE_DUMP``, write a numbered snapshot (with its peak) once, when the traced
    total or the process's resident memory first reaches a limit, or when a
    :exc:`MemoryError` goes uncaught, and keep running: the evidence before the OOM killer
    strikes. LIMIT is ``SIZE`` or ``traced:SIZE`` (traced memory), ``rss:SIZE`` (resident
    memory) or ``cgroup:FRACTION`` (resident memory against a fraction of the cgroup's memory
    limit), comma-separated; see :mod:`alloctrace._memory_limit`.

``ALLOCTRACE_PUSH=URL``
    Push a memory profile to the Pyroscope-compatible server at URL every
    ``ALLOCTRACE_PUSH_INTERVAL`` seconds (default 15) and at exit (see :mod:`alloctrace._push`
    and docs/push.md for its other variables). Implies ``ALLOCTRACE=64`` and
    ``ALLOCTRACE_SAMPLE_INTERVAL=512KiB`` when they are not set.
``ALLOCTRACE_SIGNAL=SIGNAME``
    With ``ALLOCTRACE_DUMP``, write a numbered snapshot (as ``ALLOCTRACE_INTERVAL`` does)
    whenever the process receives that signal, e.g. ``SIGUSR2`` (``alloctrace snapshot PID``
    sends it and waits for the file). The snapshot is taken by a Python-level signal handler,
    which Python runs in the main thread between two bytecodes, never in the C signal handler.
    Signals Python, alloctrace or the system reserve (``SIGINT``, ``SIGTERM``, ``SIGKILL``,
    faults, job control...) are refused. alloctrace steps aside for a program's own use of the
    signal: if it is already ignored or handled when the process starts (an inherited
    ``SIG_IGN``), no handler is installed and a line on stderr says so; a handler the program
    installs later replaces alloctrace's.

A configuration error stops the interpreter with one line on stderr: running the program
untraced when the user asked for tracing would waste the run. A failure to *write* a snapshot is
reported as one line on stderr and never changes the program's behaviour or exit status.
"""

from __future__ import annotations

import os
import string
import sys
import time

from alloctrace._settings import MAX_SIZE, ConfigError, _shown, _warn, parse_size

#: The largest traceback depth :func:`alloctrace.start` accepts, as for tracemalloc.
MAX_NFRAME = 65535

ENV_NFRAME = "ALLOCTRACE"
ENV_DUMP = "ALLOCTRACE_DUMP"
ENV_INTERVAL = "ALLOCTRACE_INTERVAL"
ENV_SAMPLE_INTERVAL = "ALLOCTRACE_SAMPLE_INTERVAL"
ENV_SAMPLE_SEED = "ALLOCTRACE_SAMPLE_SEED"
ENV_OBJECTS = "ALLOCTRACE_OBJECTS"
ENV_NATIVE = "ALLOCTRACE_NATIVE"
ENV_REATTRIBUTE = "ALLOCTRACE_REATTRIBUTE"
ENV_RETENTION = "ALLOCTRACE_RETENTION"
ENV_SIGNAL = "ALLOCTRACE_SIGNAL"
ENV_MEMORY_LIMIT = "ALLOCTRACE_MEMORY_LIMIT"
ENV_PUSH = "ALLOCTRACE_PUSH"
ENV_CAPTURE = "ALLOCTRACE_CAPTURE"
ENV_CAPTURE_KEEP = "ALLOCTRACE_CAPTURE_KEEP"
#: The largest ``ALLOCTRACE_CAPTURE_KEEP`` accepted.
MAX_CAPTURE_KEEP = 1_000_000
#: Sites that get a retention report in each dump written with ``ALLOCTRACE_OBJECTS=1``, unless
#: ``ALLOCTRACE_RETENTION`` says otherwise.
RETENTION_SITES = 5
#: The most sites ``ALLOCTRACE_RETENTION`` accepts (each costs a share of one heap walk).
MAX_RETENTION_SITES = 1000
XOPTION = "alloctrace"

#: Exit status when the start-up configuration is invalid (the usual "bad usage" status).
CONFIG_ERROR_STATUS = 2

#: The shortest ``ALLOCTRACE_INTERVAL`` accepted, in seconds: at most ten periodic snapshots a
#: second, each a file and a pass over the whole trace table.
MIN_INTERVAL = 0.1

#: How often, in seconds, the snapshot thread looks at the count of request signals for one
#: whose Python handler has not run (see :meth:`Dumper._serve_requests`).
REQUEST_POLL = 0.5

#: The longest ``ALLOCTRACE_INTERVAL`` accepted, in seconds (365 days): longer waits overflow
#: the interval thread's timer (``threading.TIMEOUT_MAX``), and would never come anyway.
MAX_INTERVAL = 365 * 24 * 3600

#: Once a SIGTERM's handler has started writing the exit snapshot, the process dies of
#: SIGTERM this many seconds later at the latest (the snapshot may be waiting on something
#: that never comes); a handler that never starts is given about 5 s.
SIGTERM_DUMP_SECONDS = 30.0

#: The largest sampling interval :func:`alloctrace.start` accepts (1 TiB).
MAX_SAMPLE_INTERVAL = 1 << 40

_PLACEHOLDERS = ("pid", "time", "n")


class Config:
    """The start-up settings read from the environment and ``-X`` options."""

    __slots__ = (
        "nframe",
        "dump",
        "interval",
        "sample_interval",
        "sample_seed",
        "objects",
        "retention",
        "native",
        "reattribute",
        "capture",
        "capture_keep",
    )

    def __init__(
        self,
        nframe: int,
        dump: str | None = None,
        interval: float | None = None,
        sample_interval: int | None = None,
        sample_seed: int | None = None,
        objects: bool = False,
        retention: int = RETENTION_SITES,
        native: bool = False,
        reattribute: bool = True,
        capture: str | None = None,
        capture_keep: int | None = None,
    ):
        self.nframe = nframe
        self.dump = dump
        self.interval = interval
        self.sample_interval = sample_interval
        self.sample_seed = sample_seed
        self.objects = objects
        self.retention = retention
        self.native = native
        self.reattribute = reattribute
        #: The capture directory (``ALLOCTRACE_CAPTURE``); *dump* is then inside it.
        self.capture = capture
        #: How many ended processes keep their files in the capture (0: all).
        self.capture_keep = capture_keep

    def __repr__(self) -> str:
        return (
            f"Config(nframe={self.nframe!r}, dump={self.dump!r}, interval={self.interval!r}, "
            f"sample_interval={self.sample_interval!r}, sample_seed={self.sample_seed!r}, "
            f"objects={self.objects!r}, retention={self.retention!r}, native={self.native!r}, "
            f"reattribute={self.reattribute!r}, capture={self.capture!r}, "
            f"capture_keep={self.capture_keep!r})"
        )


def _decimal(value: str) -> int | None:
    """*value* as a plain decimal number (ASCII digits, surrounding blanks allowed), else
    ``None``: ``int()`` would also take ``1_0``, ``+5`` and other scripts' digits."""
    text = value.strip()
    # 40 digits is beyond every limit here (2**64 has 20), and far below int()'s own limit.
    if not text or len(text) > 40 or not text.isascii() or not text.isdigit():
        return None
    return int(text, 10)


def _parse_switch(value: str, source: str) -> bool:
    """Parse an on/off setting named *source*: ``1`` (on) or ``0`` (off)."""
    text = value.strip()
    if text not in ("0", "1"):
        raise ConfigError(f"{source}={value!r} is invalid: expected 1 (on) or 0 (off)")
    return text == "1"


def parse_objects(value: str) -> bool:
    """Parse ``ALLOCTRACE_OBJECTS``: ``1`` (record object kinds) or ``0`` (do not)."""
    return _parse_switch(value, ENV_OBJECTS)


def parse_native(value: str, source: str = ENV_NATIVE) -> bool:
    """Parse ``ALLOCTRACE_NATIVE``: ``1`` (trace native allocations too) or ``0`` (do not)."""
    return _parse_switch(value, source)


def parse_reattribute(value: str, source: str = ENV_REATTRIBUTE) -> bool:
    """Parse ``ALLOCTRACE_REATTRIBUTE``: ``1`` (re-attribute reused objects) or ``0`` (do not)."""
    return _parse_switch(value, source)


def parse_retention(value: str, source: str = ENV_RETENTION) -> int:
    """Parse ``ALLOCTRACE_RETENTION``: how many sites get a retention report per dump."""
    try:
        sites = int(value.strip(), 10)
    except ValueError:
        sites = -1
    if not 0 <= sites <= MAX_RETENTION_SITES:
        shown = f"{source}={value!r}" if source.isupper() else f"{source} {value!r}"
        raise ConfigError(
            f"{shown} is invalid: expected a number of sites from 0 to {MAX_RETENTION_SITES}"
        )
    return sites


def parse_capture_keep(value: str, source: str = ENV_CAPTURE_KEEP) -> int:
    """Parse ``ALLOCTRACE_CAPTURE_KEEP``: how many ended processes keep their snapshot files
    in a capture (``0``: all of them)."""
    keep = _decimal(value)
    if keep is None or keep > MAX_CAPTURE_KEEP:
        shown = f"{source}={value!r}" if source.isupper() else f"{source} {value!r}"
        raise ConfigError(
            f"{shown} is invalid: expected a number of processes from 0 (keep all) to "
            f"{MAX_CAPTURE_KEEP:,}"
        )
    return keep


#: Signals ALLOCTRACE_SIGNAL refuses: uncatchable, used by Python or by alloctrace's exit dump,
#: faults, and job control.
RESERVED_SIGNALS = (
    "SIGKILL", "SIGSTOP", "SIGINT", "SIGTERM", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL",
    "SIGABRT", "SIGTRAP", "SIGSYS", "SIGCHLD", "SIGPIPE", "SIGTSTP", "SIGTTIN", "SIGTTOU",
    "SIGCONT",
)  # fmt: skip


def parse_signal(value: str) -> int:
    """Parse ``ALLOCTRACE_SIGNAL``: a signal name such as ``SIGUSR2`` (or ``USR2``, any case)."""
    import signal

    name = value.strip().upper()
    if name and not name.startswith("SIG"):
        name = "SIG" + name
    if name in RESERVED_SIGNALS:
        raise ConfigError(
            f"{ENV_SIGNAL}={value!r} is invalid: {name} is reserved (by the system, Python or "
            "alloctrace); use SIGUSR1 or SIGUSR2"
        )
    number = getattr(signal.Signals, name, None) if name.isidentifier() else None
    if number is None:
        raise ConfigError(
            f"{ENV_SIGNAL}={value!r} is invalid: not a signal name (e.g. SIGUSR2, SIGUSR1)"
        )
    return int(number)


def read_signal(environ, ignore_environment: bool, dump: str | None) -> int | None:
    """The ``ALLOCTRACE_SIGNAL`` setting: a signal number, or ``None`` when unset."""
    value = "" if ignore_environment else environ.get(ENV_SIGNAL, "")
    if not value:
        return None
    signum = parse_signal(value)
    if dump is None:
        raise ConfigError(
            f"{ENV_SIGNAL} is set but {ENV_DUMP} is not: snapshots on demand need a path"
        )
    return signum


def read_memory_limit(environ, ignore_environment: bool, dump: str | None):
    """The ``ALLOCTRACE_MEMORY_LIMIT`` setting (a :class:`alloctrace._memory_limit.MemoryLimit`),
    or ``None`` when unset."""
    value = "" if ignore_environment else environ.get(ENV_MEMORY_LIMIT, "")
    if not value:
        return None
    from alloctrace._memory_limit import parse_memory_limit

    limit = parse_memory_limit(value)
    if dump is None:
        raise ConfigError(
            f"{ENV_MEMORY_LIMIT} is set but {ENV_DUMP} is not: the snapshot needs a path"
        )
    return limit


def parse_nframe(value: str, source: str) -> int:
    """Parse a frame count from *source* (``"ALLOCTRACE"`` or ``"-X alloctrace"``)."""
    nframe = _decimal(value)
    if nframe is None or nframe > MAX_NFRAME:
        if source == ENV_NFRAME:
            shown = f"{ENV_NFRAME}={_shown(value)}"
        else:
            shown = f"-X {XOPTION}={_shown(value)[1:-1]}"
        raise ConfigError(
            f"{shown} is invalid: expected a number of frames from 0 to {MAX_NFRAME} "
            "(0 disables tracing)"
        )
    return nframe


def parse_interval(value: str) -> float:
    """Parse ``ALLOCTRACE_INTERVAL``: a number of seconds from :data:`MIN_INTERVAL` to
    :data:`MAX_INTERVAL`."""
    try:
        seconds = float(value.strip())
    except ValueError:
        seconds = float("nan")
    if not MIN_INTERVAL <= seconds <= MAX_INTERVAL:
        raise ConfigError(
            f"{ENV_INTERVAL}={_shown(value)} is invalid: expected a number of seconds, at "
            f"least {MIN_INTERVAL} and at most {MAX_INTERVAL} (365 days)"
        )
    return seconds


def parse_sample_interval(value: str, source: str = ENV_SAMPLE_INTERVAL) -> int:
    """Parse a sampling interval in bytes; ``0`` means exact tracing."""
    size = parse_size(value)
    if size is None or size > MAX_SAMPLE_INTERVAL:
        shown = f"{source}={_shown(value)}" if source.isupper() else f"{source} {_shown(value)}"
        raise ConfigError(
            f"{shown} is invalid: expected a number of bytes from 0 (exact tracing) to 1TiB, "
            "with an optional unit (e.g. 524288, 512KiB, 512k, 2MiB)"
        )
    return size


def parse_sample_seed(value: str, source: str = ENV_SAMPLE_SEED) -> int:
    """Parse ``ALLOCTRACE_SAMPLE_SEED``: an integer from 0 to 2**64-1."""
    seed = _decimal(value)
    if seed is None or seed >= 1 << 64:
        shown = f"{source}={_shown(value)}" if source.isupper() else f"{source} {_shown(value)}"
        raise ConfigError(f"{shown} is invalid: expected an integer from 0 to 2**64-1")
    return seed


def check_path_template(template: str, source: str = ENV_DUMP) -> str:
    """Check that *template* only uses the ``{pid}``, ``{time}`` and ``{n}`` placeholders,
    bare: a format spec or conversion (``{time:d}``, ``{pid!r}``, ``{pid:>99}``) could fail at
    exit, when the snapshot is due, or make a path of any length."""
    shown = f"{source}={_shown(template)}"
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(
            f"{shown} is invalid: {exc} (write {{{{ and }}}} for literal braces)"
        ) from None
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if field not in _PLACEHOLDERS:
            raise ConfigError(
                f"{shown} is invalid: unknown placeholder {_shown('{' + field + '}')[1:-1]}; "
                "accepted: {pid}, {time}, {n} (write {{ and }} for literal braces)"
            )
        if spec or conversion:
            raise ConfigError(
                f"{shown} is invalid: placeholder {{{field}}} takes no format spec or "
                "conversion; accepted: {pid}, {time}, {n}"
            )
    return template


def _has_n(template: str) -> bool:
    return any(field == "n" for _, field, _, _ in string.Formatter().parse(template))


def format_time(timestamp: float) -> str:
    """The ``{time}`` placeholder: local time, sortable, safe in a file name."""
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(timestamp))


def expand_path(
    template: str, *, pid: int, timestamp: float | None = None, n: int | None = None
) -> str:
    """Replace the placeholders of a dump path.

    ``{pid}`` is the process id, ``{time}`` the local time of the dump as ``YYYYmmdd-HHMMSS``
    and ``{n}`` the number of a periodic snapshot. A numbered snapshot whose template has no
    ``{n}`` gets ``.N`` before the file name's extension instead (``app.snap`` -> ``app.1.snap``,
    so that ``*.snap`` patterns find it), and never overwrites the exit snapshot. The
    exit snapshot is written with *n* ``None``; if the template has ``{n}`` the caller passes the
    next number, so the exit snapshot continues the sequence.
    """
    if timestamp is None:
        timestamp = time.time()
    path = template.format(pid=pid, time=format_time(timestamp), n=n if n is not None else 0)
    if n is not None and not _has_n(template):
        root, extension = os.path.splitext(path)
        path = f"{root}.{n}{extension}"
    return path


def read_config(environ, xoptions, ignore_environment: bool) -> Config:
    """Work out the start-up settings; raise :class:`ConfigError` for an unusable value."""
    if ignore_environment:
        environ = {}
    nframe = None
    if XOPTION in xoptions:
        value = xoptions[XOPTION]
        # A bare "-X alloctrace" arrives as True, like "-X tracemalloc".
        nframe = 1 if value is True else parse_nframe(value, "-X " + XOPTION)
    env_nframe = environ.get(ENV_NFRAME, "")
    if env_nframe:
        parsed = parse_nframe(env_nframe, ENV_NFRAME)
        if nframe is None:
            nframe = parsed
    dump = environ.get(ENV_DUMP) or None
    if dump is not None:
        check_path_template(dump)
    capture = environ.get(ENV_CAPTURE) or None
    if capture is not None:
        if dump is not None:
            raise ConfigError(
                f"{ENV_CAPTURE} and {ENV_DUMP} are both set: a capture names its own snapshot "
                "files; set one of them"
            )
        # Only for the checks below, which need to know that snapshots will be written.
        dump = os.path.join(capture, "{pid}.snap")
    capture_keep = None
    env_keep = environ.get(ENV_CAPTURE_KEEP, "")
    if env_keep:
        capture_keep = parse_capture_keep(env_keep)
        if capture is None:
            raise ConfigError(
                f"{ENV_CAPTURE_KEEP} is set but {ENV_CAPTURE} is not: it bounds a capture"
            )
    if dump is not None and "ALLOCTRACE_FILE_MODE" in environ:
        from ._output import OutputError, file_mode

        try:
            file_mode(environ["ALLOCTRACE_FILE_MODE"])
        except OutputError as error:
            raise ConfigError(str(error)) from None
    interval = None
    env_interval = environ.get(ENV_INTERVAL, "")
    if env_interval:
        interval = parse_interval(env_interval)
        if dump is None:
            raise ConfigError(
                f"{ENV_INTERVAL} is set but {ENV_DUMP} is not: periodic snapshots need a path"
            )
    sample_interval = None
    env_sample = environ.get(ENV_SAMPLE_INTERVAL, "")
    if env_sample:
        sample_interval = parse_sample_interval(env_sample)
    push = bool(environ.get(ENV_PUSH))
    if push and not env_sample:
        from alloctrace._push import DEFAULT_SAMPLE_INTERVAL

        sample_interval = DEFAULT_SAMPLE_INTERVAL
    sample_seed = None
    env_seed = environ.get(ENV_SAMPLE_SEED, "")
    if env_seed:
        sample_seed = parse_sample_seed(env_seed)
        if not sample_interval:
            raise ConfigError(
                f"{ENV_SAMPLE_SEED} is set but {ENV_SAMPLE_INTERVAL} is not: the seed only "
                "applies to sampled tracing"
            )
    objects = False
    env_objects = environ.get(ENV_OBJECTS, "")
    if env_objects:
        objects = parse_objects(env_objects)
        if objects and dump is None:
            raise ConfigError(
                f"{ENV_OBJECTS} is set but {ENV_DUMP} is not: object kinds are recorded in "
                "the dumped snapshots"
            )
    retention = RETENTION_SITES
    env_retention = environ.get(ENV_RETENTION, "")
    if env_retention:
        retention = parse_retention(env_retention)
        if not objects:
            raise ConfigError(
                f"{ENV_RETENTION} is set but {ENV_OBJECTS}=1 is not: retention reports are "
                "captured with object kinds"
            )
    native = False
    env_native = environ.get(ENV_NATIVE, "")
    if env_native:
        native = parse_native(env_native)
    reattribute = True
    env_reattribute = environ.get(ENV_REATTRIBUTE, "")
    if env_reattribute:
        reattribute = parse_reattribute(env_reattribute)
    if nframe is None and push:
        from alloctrace._push import DEFAULT_NFRAME

        nframe = DEFAULT_NFRAME
    if nframe is None:
        configured = dump is not None or sample_interval is not None or native
        nframe = 1 if configured else 0
    if nframe == 0:
        # Tracing explicitly off: there is nothing to dump either.
        return Config(0)
    return Config(
        nframe,
        dump,
        interval,
        sample_interval or None,
        sample_seed,
        objects,
        retention,
        native,
        reattribute,
        capture,
        capture_keep,
    )


def _own_code_filter(alloctrace) -> list:
    """Leaves out of the snapshots the dumper writes the blocks that alloctrace's own Python
    code allocated (the previous snapshot kept to report growth, the statistics of its
    retention reports, a limit's message...): they are the tool's memory, not the program's,
    and a user reading ``alloctrace/_snapshot.py:773`` among their lines can do nothing about
    it. A block counts as ours when its most recent frame is in the alloctrace package, as
    ``Filter(False, tracemalloc.__file__)`` leaves out tracemalloc's."""
    package = os.path.dirname(os.path.abspath(alloctrace.__file__))
    return [alloctrace.Filter(False, os.path.join(package, "*"))]


class Dumper:
    """Writes the exit snapshot (once) and the periodic ones, for one process.

    A forked child gets a fresh lock, counter and interval thread (threads do not survive a
    fork), and its own snapshot files when the path has ``{pid}``.
    """

    def __init__(
        self,
        template: str,
        interval: float | None,
        objects: bool = False,
        retention: int = RETENTION_SITES,
        recorder=None,
    ):
        import atexit
        import signal
        import threading

        from alloctrace._signals import set_handler

        self._atexit = atexit
        self._signal = signal
        # signal.signal without CPython's race when the new handler is SIG_IGN or SIG_DFL.
        self._set_handler = set_handler
        self._threading = threading
        # Relative to where the program started, even if it changes directory later.
        self.template = os.path.abspath(template)
        # With a capture (ALLOCTRACE_CAPTURE), the alloctrace._capture.Recorder that names
        # this process's files and writes its manifest records.
        self._recorder = recorder
        if recorder is not None:
            self.template = _literal(recorder.template())
        self.interval = interval
        self.objects = objects
        self.retention = retention
        # The last snapshot written with objects: the next one reports what grew since.
        self._previous = None
        # (total, peak snapshot) of the highest interval peak that numbered snapshots reset.
        self._run_peak = None
        # Re-entrant: the SIGTERM handler may interrupt the main thread inside dump_at_exit.
        self._lock = threading.RLock()
        self._count = 0
        self._done = False
        # Signals held while the exit snapshot is written, to be acted on once it is.
        self._held = None
        self._stop = threading.Event()
        self._thread = None
        # The ALLOCTRACE_SIGNAL signal, once its handler is installed, and the pipe from the
        # handler to the thread that writes the snapshots asked for (read end, write end).
        self._request_signum = None
        self._request_pipe = None
        # Whether _on_request is running, and whether a request came meanwhile (it runs in
        # the main thread only).
        self._in_request = False
        self._again = False
        self._request_thread = None
        # What _block_own_signals blocked in this thread for the fork under way.
        self._fork_mask = threading.local()
        # The exit snapshot's figures for the capture's manifest (see _figures).
        self._figures = None

    def install(self) -> None:
        self._atexit.register(self.dump_at_exit)
        self._install_sigterm()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(
                before=self._block_own_signals,
                after_in_parent=self._unblock_own_signals,
                after_in_child=self._after_fork_in_child,
            )
        self._start_thread()

    def _install_sigterm(self) -> None:
        signal = self._signal
        # Only when nobody chose otherwise: an inherited SIG_IGN must stay ignored, and a
        # handler the program installs later simply replaces ours.
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self._arm_sigterm_retry()

    def _arm_sigterm_retry(self) -> None:
        """Have SIGTERM sent again to the main thread until :meth:`_on_sigterm` starts.

        CPython runs a Python handler only when the main thread next checks; one that had
        just checked and then blocked (a Pool worker entering ``sem_wait`` as
        ``Pool.terminate()`` signals it) would wait forever where SIGTERM's default action
        would have killed it. Repeated, the signal interrupts the wait; after about 5 s
        without the handler starting, SIGTERM's default action ends the process (no
        snapshot). Needs the main thread, and our handler just installed.
        """
        if self._threading.current_thread() is self._threading.main_thread():
            from alloctrace import _native

            _native._sigterm_retry_arm()

    def _on_sigterm(self, signum, frame) -> None:
        from alloctrace import _native

        _native._sigterm_retry_acknowledge(SIGTERM_DUMP_SECONDS)
        if self._held is not None:
            # The exit snapshot is being written (this handler interrupted it): finish it.
            self._held.append(signum)
            return
        self.dump_at_exit(self._signal.Signals(signum).name)
        self._die_of(signum)

    def _die_of(self, signum) -> None:
        """Die of *signum* by its default action, so that the parent sees "killed by
        SIGTERM" (or SIGINT), as it would have without the snapshot."""
        self._set_handler(signum, self._signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)

    def _hold_signals(self) -> dict:
        """Defer SIGTERM and SIGINT where they would end the process (default action,
        Python's KeyboardInterrupt, or our own handler); a handler the program installed is
        left alone. Only the main thread can change handlers; elsewhere nothing is held."""
        signal = self._signal
        held = {}
        if self._threading.current_thread() is not self._threading.main_thread():
            return held
        self._held = []
        for signum in (signal.SIGTERM, signal.SIGINT):
            handler = signal.getsignal(signum)
            if handler in (signal.SIG_DFL, signal.default_int_handler, self._on_sigterm):
                signal.signal(signum, self._on_held_signal)
                held[signum] = handler
                if signum == signal.SIGTERM and handler == self._on_sigterm:
                    # Keep the deadline of a handler that started (see _on_sigterm).
                    self._arm_sigterm_retry()
        return held

    def _on_held_signal(self, signum, frame) -> None:
        if signum == self._signal.SIGTERM:
            from alloctrace import _native

            _native._sigterm_retry_acknowledge(SIGTERM_DUMP_SECONDS)
        self._held.append(signum)

    def _release_signals(self, held: dict) -> None:
        """Restore the handlers; if a held signal came, die of it now."""
        for signum, handler in held.items():
            self._set_handler(signum, handler)
            if handler == self._on_sigterm:
                self._arm_sigterm_retry()
        pending, self._held = self._held, None
        if pending:
            self._die_of(pending[0])

    def install_signal(self, signum: int) -> None:
        """Write a numbered snapshot on *signum*, unless the process already ignores or
        handles it (then say so and leave it alone)."""
        signal = self._signal
        name = signal.Signals(signum).name
        current = signal.getsignal(signum)
        if current != signal.SIG_DFL:
            what = "ignored" if current == signal.SIG_IGN else "handled"
            _warn(f"{ENV_SIGNAL}={name}: the signal is already {what} here; no snapshots on it")
            return
        self._start_request_thread()
        signal.signal(signum, self._on_request)
        self._request_signum = signum
        from alloctrace import _native

        # Counted in C as well, for the requests whose Python handler does not run soon.
        _native._request_count_arm(signum)

    def _start_request_thread(self) -> None:
        """Start the thread that writes the snapshots asked for by signal, and the pipe that
        wakes it.

        The handler itself only writes a byte to the pipe: a snapshot written in the handler
        ran on the main thread wherever the signal interrupted it, so a signal arriving during
        that dump started another inside it (a storm ended in RecursionError, and requests were
        lost), and a dump with object kinds could wait for ever on a lock the interrupted code
        held. The thread reads every request pending and writes one snapshot for all of them
        (each request is answered by a snapshot begun after it), at most one every
        :data:`MIN_INTERVAL` seconds, however many signals come.
        """
        from alloctrace import _native, _threads

        # Kept here: the handler may run while the interpreter finalizes, and imports nothing.
        self._write_request = _native._write_request
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)
        self._request_pipe = (read_end, write_end)
        self._request_thread = self._threading.Thread(
            target=self._serve_requests, args=(read_end,), name="alloctrace-on-demand", daemon=True
        )
        _threads.start(self._request_thread)

    def stop_requests(self) -> None:
        """Stop answering the snapshot signal (``alloctrace detach``, once the handler is
        gone): the write end of the pipe is closed, and the thread, seeing its end, closes the
        read end and returns; waited for up to a second, so that a detached process is left
        with the threads it had."""
        pipe, self._request_pipe = self._request_pipe, None
        if pipe is None:
            return
        os.close(pipe[1])
        thread = self._request_thread
        if thread is not None and thread is not self._threading.current_thread():
            thread.join(1.0)

    def _on_request(self, signum, frame) -> None:
        pipe = self._request_pipe
        if pipe is None:
            return  # requests stopped (detach) as the signal came
        if self._in_request:
            # CPython runs a handler again inside a running one: at each check between two
            # bytecodes it runs pending handlers before it gives the GIL to a thread asking
            # for it, and takes it back with the storm's next signal pending, one level
            # deeper each time, until RecursionError (seen at exit in CI). The running
            # handler writes once more for this request instead.
            self._again = True
            return
        self._in_request = True
        try:
            for _ in range(2):
                self._again = False
                try:
                    # Keeps the GIL (os.write gives it up). A full pipe is no error: the
                    # requests pending get a snapshot after this one.
                    self._write_request(pipe[1])
                except OSError:
                    break  # closed: requests stopped as the signal came
                if not self._again:
                    break
        finally:
            self._in_request = False

    def _serve_requests(self, read_end: int) -> None:
        """Write a snapshot for the requests pending, as the handler's bytes or the count of
        request signals tell.

        The handler runs in the main thread only, when it next checks; one that had checked
        just before the signal and then blocked in a system call (reading stdin) or in native
        code does not run it until that call returns. The C-level count does not wait for
        the main thread, so a request counted and not yet answered is answered within
        :data:`REQUEST_POLL` seconds all the same.
        """
        import select

        from alloctrace import _native

        last = None
        answered = _native._request_count()
        while True:
            try:
                ready, _, _ = select.select([read_end], [], [], REQUEST_POLL)
                if not ready and _native._request_count() == answered:
                    continue
                if last is not None and time.monotonic() - last < MIN_INTERVAL:
                    time.sleep(max(0.0, last + MIN_INTERVAL - time.monotonic()))
                # Everything asked for until now, answered by the one snapshot begun next.
                while True:
                    if not os.read(read_end, 65536):
                        # The write end was closed: requests stopped (stop_requests).
                        os.close(read_end)
                        return
            except BlockingIOError:
                pass
            except OSError:
                return  # closed (a forked child replaced it)
            if self._done:
                return
            last = time.monotonic()
            # Every request counted until now is answered by the snapshot begun next.
            answered = _native._request_count()
            self.dump_numbered()

    def _ignore_requests(self) -> None:
        """After the exit snapshot, the snapshot signal is ignored: once the interpreter resets
        its handlers while finalizing, the signal's default action would kill the process and
        change its exit status. Only the main thread can change a handler."""
        signal = self._signal
        signum = self._request_signum
        if (
            signum is not None
            and self._threading.current_thread() is self._threading.main_thread()
            and signal.getsignal(signum) == self._on_request
        ):
            self._set_handler(signum, signal.SIG_IGN)

    def dump_numbered(self) -> str | None:
        """Write the next numbered snapshot now (as the interval thread does); return its path,
        or ``None`` if none was written."""
        with self._lock:
            if self._done:
                return None
            self._count += 1
            path = expand_path(self.template, pid=os.getpid(), n=self._count)
            return path if self._write(path, numbered=True) else None

    def _start_thread(self) -> None:
        if self.interval is None:
            return
        from alloctrace import _threads

        self._thread = self._threading.Thread(
            target=self._run, name="alloctrace-interval-dump", daemon=True
        )
        _threads.start(self._thread)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.dump_numbered()
            if self._done:
                return

    def dump_at_exit(self, how: str = "exit") -> None:
        """Write the final snapshot, once, whichever exit path gets here first.

        *how* the process is ending (``"exit"``, a signal's name, ``"exec"``) goes into the
        capture's manifest, when there is one.

        From the main thread, a SIGTERM or SIGINT arriving meanwhile is held until the
        snapshot is in place, then the process dies of it (exit status as if killed by that
        signal): a signal never cuts the snapshot short nor leaves its temporary file. A
        handler the program installed for either signal is not touched.
        """
        # Signals are held before anything takes a lock: a SIGTERM handled inside
        # Event.set() (multiprocessing's finalizers run this at a worker's exit, just as
        # Pool.terminate() sends SIGTERM) would otherwise re-enter it and wait forever on the
        # Event's own lock.
        held = self._hold_signals()
        try:
            self._stop.set()
            with self._lock:
                if self._done:
                    return
                self._done = True
                n = self._count + 1 if _has_n(self.template) else None
                path = expand_path(self.template, pid=os.getpid(), n=n)
                written = self._write(path)
                if self._recorder is not None:
                    figures, self._figures = self._figures, None
                    self._recorder.ended(how, path if written else None, figures)
        finally:
            self._ignore_requests()
            self._release_signals(held)

    def exec_failed(self) -> None:
        """The ``os.exec*`` that :meth:`dump_at_exit` wrote the exit snapshot for failed: the
        process goes on, and will write it again when it really ends."""
        with self._lock:
            self._done = False

    def _write(self, path: str, numbered: bool = False) -> bool:
        """Write a snapshot to *path*; whether it was written.

        A *numbered* snapshot carries the peak of its interval, since the previous numbered
        one (or the start), and the peak starts afresh after it, so that a series shows how
        the peak moved; the exit snapshot carries the peak of the whole run, the highest of
        those intervals' and the last one's.
        """
        try:
            import alloctrace

            if not alloctrace.is_tracing():
                _warn(f"no snapshot written to {path}: tracing was stopped by the program")
                return False
            # The peak is taken first, and reset at once after it: the snapshot's own work
            # must not move it, nor fall between two intervals.
            peak_total = alloctrace.get_traced_memory()[1]
            own = _own_code_filter(alloctrace)
            peak = alloctrace.take_snapshot(peak=True).filter_traces(own)
            if numbered:
                alloctrace.reset_peak()
                if self._run_peak is None or peak_total > self._run_peak[0]:
                    self._run_peak = (peak_total, peak)
            elif self._run_peak is not None and self._run_peak[0] > peak_total:
                peak = self._run_peak[1]
            if not self.objects:
                snapshot = alloctrace.take_snapshot().filter_traces(own)
                snapshot._with_peak(peak).dump(path)
            else:
                from alloctrace._retention import without_user_code

                # Written at a moment the program did not choose (a signal may have interrupted
                # it holding a lock): the retention reports run none of its code (__repr__).
                with without_user_code():
                    snapshot = alloctrace.take_snapshot(
                        objects=True, retention=self.retention, baseline=self._previous
                    ).filter_traces(own)
                snapshot._with_peak(peak).dump(path)
                self._previous = snapshot
            if self._recorder is not None:
                self._recorder.snapshot_written(path, self._count if numbered else None)
                if not numbered:
                    self._figures = _figures(snapshot, peak)
            return True
        except BaseException as exc:
            # Never let a failed dump change how the program ends.
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            _warn(f"cannot write snapshot to {path}: {reason or type(exc).__name__}")
            return False

    def _block_own_signals(self) -> None:
        """Block, in the forking thread, the signals whose handler is ours, until the fork
        is over (:meth:`_unblock_own_signals`).

        CPython clears the signals its C handler recorded when the child resets its signal
        state after ``fork()``, so a signal reaching a child before that reset is lost. With
        ``SIG_DFL`` the kernel would have killed the child; with our Python-level SIGTERM
        handler in its place, a ``Pool.terminate()`` that signals a worker which has not run
        yet left that worker waiting forever for a task. Blocked, the signal stays pending
        in the kernel and is delivered once the child unblocks it, after the reset.
        """
        signal = self._signal
        ours = {
            signum
            for signum in (signal.SIGTERM, self._request_signum)
            if signum is not None
            and signal.getsignal(signum) in (self._on_sigterm, self._on_request)
        }
        if ours:
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, ours)
            # Per thread: two threads may fork at once. Only what was not blocked before.
            self._fork_mask.unblock = ours - set(previous)

    def _unblock_own_signals(self) -> None:
        unblock = getattr(self._fork_mask, "unblock", None)
        if unblock:
            self._fork_mask.unblock = None
            # A signal that came meanwhile is delivered now and its handler runs here.
            self._signal.pthread_sigmask(self._signal.SIG_UNBLOCK, unblock)

    def _after_fork_in_child(self) -> None:
        if self._recorder is not None:
            # A process of its own in the capture: its own record and snapshot file.
            self._recorder.begin("fork")
            self.template = _literal(self._recorder.template())
        self._previous = None
        self._in_request = False
        self._lock = self._threading.RLock()
        self._stop = self._threading.Event()
        self._count = 0
        self._done = False
        if self._signal.getsignal(self._signal.SIGTERM) == self._on_sigterm:
            # The wrapper is inherited, the parent's timer is not.
            self._arm_sigterm_retry()
        if self._request_pipe is not None:
            # The parent's thread reads the inherited pipe: the child needs its own (before a
            # request held since the fork is let in).
            for fd in self._request_pipe:
                os.close(fd)
            self._start_request_thread()
        # Only now that the state above is the child's own: a SIGTERM sent to the child
        # since the fork runs our handler here, which writes the child's snapshot and dies.
        self._unblock_own_signals()
        self._start_thread()
        # multiprocessing's fork children leave through os._exit, skipping atexit; its own
        # exit hook still runs, so register there. Its registry is cleared in the child right
        # after the fork, then the after-fork callbacks run, so go through those.
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:
            mp_util.register_after_fork(self, Dumper._register_multiprocessing_exit)

    def _register_multiprocessing_exit(self) -> None:
        mp_util = sys.modules["multiprocessing.util"]
        mp_util.Finalize(None, self.dump_at_exit, exitpriority=-1000)


def _figures(snapshot, peak) -> dict:
    """What a capture's ``end`` record says of the exit snapshot: traced memory and blocks,
    and the peak traced total, summed as ``alloctrace stats`` sums them; they stand for the
    process once its files are dropped to bound the capture."""
    from alloctrace._snapshot import totals

    size, count = totals(snapshot)
    return {"size": size, "count": count, "peak": max(totals(peak)[0], size)}


def _literal(path: str) -> str:
    """*path* as a dump template without placeholders (its braces escaped)."""
    return path.replace("{", "{{").replace("}", "}}")


def is_command_line_tool(argv: list[str] | None = None) -> bool:
    """Whether this interpreter runs the ``alloctrace`` command: its console script or
    ``python -m alloctrace``, read from the interpreter's own command line *argv*.

    The command must never trace itself: the ALLOCTRACE variables it inherits are meant for the
    programs the user traces (an exported ``ALLOCTRACE_DUMP=app.snap`` would otherwise have
    ``alloctrace stats app.snap`` overwrite the file it reads with a snapshot of itself).
    """
    if argv is None:
        # While site runs, sys.argv[0] is the script, or "-m" without the module's name:
        # the full command line is in sys.orig_argv (3.10+) or /proc (3.9).
        if sys.argv and sys.argv[0] not in ("-m", "-c", ""):
            return os.path.basename(sys.argv[0]) == "alloctrace"
        argv = getattr(sys, "orig_argv", None)
        if argv is None:
            try:
                with open("/proc/self/cmdline", "rb") as file:
                    argv = os.fsdecode(file.read()).split("\0")
            except OSError:
                return False
    args = iter(argv[1:])
    for arg in args:
        if not arg.startswith("-") or arg in ("-", "--"):
            return os.path.basename(arg) == "alloctrace"
        if arg in ("-X", "-W"):
            next(args, None)
            continue
        if arg.startswith(("-X", "-W", "--")):
            continue
        for index, flag in enumerate(arg[1:], 2):
            if flag == "c":
                return False
            if flag == "m":
                return (arg[index:] or next(args, "")) == "alloctrace"
    return False


_dumper: Dumper | None = None
_installed = False


def _forwarding(original):
    """*original* (``subprocess._args_from_interpreter_flags``) with ``-X alloctrace`` added
    whenever this interpreter has it, as CPython adds ``-X tracemalloc``."""

    def _args_from_interpreter_flags():
        args = original()
        xoptions = getattr(sys, "_xoptions", {})
        if XOPTION in xoptions:
            value = xoptions[XOPTION]
            args += ["-X", XOPTION if value is True else f"{XOPTION}={value}"]
        return args

    _args_from_interpreter_flags.__doc__ = original.__doc__
    _args_from_interpreter_flags.__wrapped__ = original  # type: ignore[attr-defined]
    _args_from_interpreter_flags._alloctrace_forwards = True  # type: ignore[attr-defined]
    return _args_from_interpreter_flags


def _forward_in(module) -> None:
    original = getattr(module, "_args_from_interpreter_flags", None)
    if callable(original) and not getattr(original, "_alloctrace_forwards", False):
        module._args_from_interpreter_flags = _forwarding(original)


def forward_xoption() -> None:
    """Pass ``-X alloctrace`` on to the interpreters :mod:`multiprocessing` starts.

    The ``spawn`` and ``forkserver`` start methods (so ``ProcessPoolExecutor`` too) give a
    child the options ``subprocess._args_from_interpreter_flags`` returns, which include
    ``-X tracemalloc`` but not ``-X alloctrace``: without this, ``python -X alloctrace app.py``
    would leave those children untraced where ``-X tracemalloc`` traces them. (The variables
    need nothing: children inherit them.) The function is wrapped when the program imports
    :mod:`subprocess` (see :mod:`alloctrace._after_import`), before :mod:`multiprocessing.util`
    copies it; a copy it made already is wrapped too.
    """
    from alloctrace._after_import import when_imported

    when_imported("subprocess", _forward_in)
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        _forward_in(util)


def _start_capture(directory: str, keep: int | None = None):
    """This process's :class:`alloctrace._capture.Recorder`, its ``start`` record written;
    *keep* ended processes keep their files (``None``: the default)."""
    from alloctrace import _capture

    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"{ENV_CAPTURE}={_shown(directory)}: cannot create the directory: {exc.strerror or exc}"
        ) from None
    recorder = _capture.Recorder(directory, _capture.DEFAULT_KEEP if keep is None else keep)
    # Children inherit the variable: absolute, it names this directory wherever they start.
    os.environ[ENV_CAPTURE] = recorder.directory
    recorder.begin("start")
    return recorder


def install() -> None:
    """Apply the start-up configuration; called from ``alloctrace_startup.pth``."""
    global _dumper, _installed
    # site.py may process the same site-packages directory twice (it does in some virtual
    # environments), running the .pth line twice: configure once.
    if _installed:
        return
    _installed = True
    if is_command_line_tool():
        return
    try:
        config = read_config(os.environ, sys._xoptions, bool(sys.flags.ignore_environment))
        # Where snapshots would go, for the checks of the settings that need a path, even with
        # tracing off (ALLOCTRACE=0: a config without one); a capture names its own files.
        dump = config.dump
        if dump is None and not sys.flags.ignore_environment:
            dump = os.environ.get(ENV_DUMP) or os.environ.get(ENV_CAPTURE) or None
        on_signal = read_signal(os.environ, bool(sys.flags.ignore_environment), dump)
        memory_limit = read_memory_limit(os.environ, bool(sys.flags.ignore_environment), dump)
        push = None if sys.flags.ignore_environment else os.environ.get(ENV_PUSH) or None
        if push is not None:
            from alloctrace import _push

            try:
                _push.settings(push)
            except ValueError as exc:
                raise ConfigError(f"{ENV_PUSH}: {exc}") from None
        recorder = (
            _start_capture(config.capture, config.capture_keep)
            if config.capture is not None
            else None
        )
    except ConfigError as exc:
        _warn(str(exc))
        # site.py swallows exceptions from .pth lines and would run the program untraced.
        os._exit(CONFIG_ERROR_STATUS)
    if XOPTION in sys._xoptions:
        forward_xoption()
    if config.nframe == 0:
        return
    try:
        import alloctrace
    except Exception as exc:
        _warn(f"cannot start tracing: {exc}")
        return
    # Everything the dumps need is imported and set up before tracing starts, so that our own
    # imports (threading, signal...) do not show up in the program's snapshots.
    dumper = (
        Dumper(config.dump, config.interval, config.objects, config.retention, recorder)
        if config.dump is not None
        else None
    )
    if recorder is not None:
        from alloctrace import _capture

        recorder.watch_children()
        _capture.on_exec = lambda: dumper.dump_at_exit("exec")
        _capture.on_exec_failed = dumper.exec_failed
    try:
        alloctrace.start(
            config.nframe,
            sample_interval=config.sample_interval,
            sample_seed=config.sample_seed,
            native=config.native,
            reattribute=config.reattribute,
        )
    except Exception as exc:
        _warn(f"cannot start tracing: {exc}")
        return
    if push is not None:
        # Like the dumper's machinery, the pusher's set-up is alloctrace's own.
        alloctrace.disable()
        try:
            alloctrace.start_push(push)
        except Exception as exc:
            _warn(f"cannot push profiles: {exc}")
        finally:
            alloctrace.enable()
    if dumper is not None:
        _dumper = dumper
        # The exit-dump machinery (atexit and signal registrations, the interval thread) is
        # alloctrace's own, not the program's: keep it out of the program's snapshots. No
        # other thread runs yet, so nothing of the program's goes unrecorded meanwhile.
        alloctrace.disable()
        try:
            dumper.install()
            if on_signal is not None:
                dumper.install_signal(on_signal)
            if memory_limit is not None:
                from alloctrace._memory_limit import LimitDump

                # Not the variable's name: under `alloctrace run` the user gave --memory-limit.
                setting = f"memory limit {memory_limit.text}"
                LimitDump(dumper.dump_numbered, memory_limit, setting).install()
        finally:
            alloctrace.enable()


def memory_limit_in_code(memory_limit, dump):
    """Check ``start(memory_limit=..., memory_limit_dump=...)``: a
    :class:`~alloctrace._memory_limit.LimitDump` to install once tracing runs, writing to
    *dump* (``{pid}`` and ``{time}`` replaced). Raise :exc:`TypeError` or :exc:`ValueError`
    naming the bad argument. Here, not in :mod:`alloctrace._memory_limit`, because it needs the
    dump machinery (:class:`Dumper`), and that module is below this one."""
    from alloctrace._memory_limit import LimitDump, MemoryLimit, parse_memory_limit

    if isinstance(memory_limit, bool) or not isinstance(memory_limit, (int, str)):
        raise TypeError(
            f"memory_limit must be an int (bytes of traced memory) or a str, not "
            f"{type(memory_limit).__name__}"
        )
    if not isinstance(dump, (str, os.PathLike)):
        raise TypeError(
            "memory_limit needs memory_limit_dump, the path of the snapshot (a str or "
            f"os.PathLike, not {type(dump).__name__})"
        )
    dump = os.fspath(dump)
    if isinstance(memory_limit, int):
        if memory_limit <= 0:
            raise ValueError(f"memory_limit must be a number of bytes > 0, not {memory_limit}")
        if memory_limit > MAX_SIZE:
            # str() of a huge int is itself refused (the digit limit): say how big it is.
            shown = memory_limit if memory_limit.bit_length() <= 256 else "a larger number"
            raise ValueError(f"memory_limit must be a number of bytes up to 2**64-1, not {shown}")
        limit = MemoryLimit(traced=memory_limit, text=str(memory_limit))
    else:
        try:
            limit = parse_memory_limit(memory_limit, "memory_limit")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    try:
        check_path_template(dump, "memory_limit_dump")
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    dumper = Dumper(dump, None)

    def write() -> str | None:
        path = expand_path(dumper.template, pid=os.getpid())
        return path if dumper._write(path) else None

    return LimitDump(write, limit, f"memory_limit={limit.text!r}")
