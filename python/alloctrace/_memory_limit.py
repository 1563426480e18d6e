"""A snapshot before the OOM killer: ``ALLOCTRACE_MEMORY_LIMIT`` and ``run --memory-limit``.

The setting is a comma-separated list of at most one traced and one resident limit:

``SIZE`` or ``traced:SIZE``
    The traced total (``get_traced_memory()``, estimates in sampled mode) reaching SIZE.
``rss:SIZE``
    The process's resident memory (the kernel's peak RSS, ``VmHWM``) reaching SIZE.
``cgroup:FRACTION``
    The process's resident memory reaching FRACTION (above 0, at most 1) of the memory limit
    of its cgroup (:func:`cgroup_memory_limit`). Where the cgroup sets no limit, a line on
    stderr says so and resident memory is not watched; the program runs as usual.

SIZE is a byte count as :func:`alloctrace._settings.parse_size` reads them (``512MiB``,
``2g``...). Traced memory is what the program's allocations hold; RSS also counts the
allocators' caches, the interpreter, libraries and untraced memory, and is what the OOM killer
and cgroup limits count (a cgroup also counts its page cache and other processes).

When a limit is first reached, a watcher thread (:class:`Watcher`) writes a numbered snapshot,
with its peak, to the dump path, once per process, says so in one line on stderr, and the
program runs on. The hooks only compare the traced total with the limit when it sets a new
peak; the watcher polls every :data:`POLL` seconds, so the snapshot comes up to a poll (plus
the wait for the GIL) after the crossing. Both measures are high-water marks: a crossing
between two polls is seen at the next one. An uncaught :exc:`MemoryError` (in any thread)
also writes that snapshot, if no limit wrote it first.
"""

from __future__ import annotations

import os

from alloctrace._settings import MAX_SIZE, ConfigError, _shown, _warn, parse_size

ENV_MEMORY_LIMIT = "ALLOCTRACE_MEMORY_LIMIT"

#: Seconds between two checks of the watcher: the traced check is one load, the RSS check a
#: read of ``/proc/self/status`` (tens of microseconds), each with the GIL for that long.
POLL = 0.01

#: cgroup v1 reports "no limit" as a huge number (the largest page count times the page size).
_V1_UNLIMITED = 1 << 62

_FORMS = (
    "expected SIZE or traced:SIZE (traced memory), rss:SIZE (resident memory) or "
    "cgroup:FRACTION (resident memory against FRACTION, above 0 and at most 1, of the "
    "cgroup's memory limit), comma-separated, e.g. 512MiB, rss:2GiB, cgroup:0.9"
)


class MemoryLimit:
    """A parsed memory-limit setting: bytes of traced or resident memory, or a fraction of the
    cgroup's limit for resident memory (``None`` where not set)."""

    __slots__ = ("traced", "rss", "cgroup_fraction", "text")

    def __init__(
        self,
        traced: int | None = None,
        rss: int | None = None,
        cgroup_fraction: float | None = None,
        text: str = "",
    ):
        self.traced = traced
        self.rss = rss
        self.cgroup_fraction = cgroup_fraction
        self.text = text

    def __repr__(self) -> str:
        return (
            f"MemoryLimit(traced={self.traced!r}, rss={self.rss!r}, "
            f"cgroup_fraction={self.cgroup_fraction!r})"
        )


def parse_memory_limit(value: str, source: str = ENV_MEMORY_LIMIT) -> MemoryLimit:
    """Parse a memory-limit setting; raise :class:`alloctrace._settings.ConfigError` naming
    *source* and the accepted forms for anything else."""
    shown = f"{source}={_shown(value)}" if source.isupper() else f"{source} {_shown(value)}"
    limit = MemoryLimit(text=value.strip())
    for item in value.split(","):
        kind, _, amount = item.strip().rpartition(":")
        kind = kind.strip().lower() or "traced"
        if kind == "cgroup":
            try:
                fraction = float(amount.strip())
            except ValueError:
                fraction = float("nan")
            if not 0 < fraction <= 1:
                raise ConfigError(f"{shown} is invalid: {_FORMS}")
            if limit.rss is not None or limit.cgroup_fraction is not None:
                raise ConfigError(f"{shown} is invalid: two resident-memory limits; {_FORMS}")
            limit.cgroup_fraction = fraction
            continue
        size = parse_size(amount)
        if kind not in ("traced", "rss") or not size:
            raise ConfigError(f"{shown} is invalid: {_FORMS}")
        if size > MAX_SIZE:
            raise ConfigError(
                f"{shown} is invalid: {_shown(amount.strip())} is more than 2**64-1 bytes; {_FORMS}"
            )
        if kind == "traced":
            if limit.traced is not None:
                raise ConfigError(f"{shown} is invalid: two traced-memory limits; {_FORMS}")
            limit.traced = size
        else:
            if limit.rss is not None or limit.cgroup_fraction is not None:
                raise ConfigError(f"{shown} is invalid: two resident-memory limits; {_FORMS}")
            limit.rss = size
    return limit


def _unescape_mount(path: str) -> str:
    """A mount point as ``/proc/self/mountinfo`` writes it: blanks and backslashes in octal."""
    if "\\" not in path:
        return path
    out, index = [], 0
    while index < len(path):
        chunk = path[index : index + 4]
        if len(chunk) == 4 and chunk[0] == "\\" and all(c in "01234567" for c in chunk[1:]):
            out.append(chr(int(chunk[1:], 8)))
            index += 4
        else:
            out.append(path[index])
            index += 1
    return "".join(out)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return file.read()
    except OSError:
        return None


def cgroup_memory_limit(root: str = "/") -> tuple[int | None, str]:
    """The memory limit of this process's cgroup in bytes, and where it was read (or, with
    ``None``, why there is none).

    The cgroup comes from ``/proc/self/cgroup``, its directory from the matching mount in
    ``/proc/self/mountinfo``: the v1 ``memory`` controller where one is mounted
    (``memory.limit_in_bytes``, where ``2**62`` and above mean no limit), else the v2 unified
    hierarchy (``memory.max``, where ``max`` means no limit). The limit that applies is the
    smallest along the path from the process's cgroup up to the mount's root, since a parent's
    limit bounds its children. *root* is prepended to every path (tests use a fake one).
    """

    def under_root(path: str) -> str:
        return os.path.join(root, path.lstrip("/"))

    cgroups = _read(under_root("/proc/self/cgroup"))
    mounts = _read(under_root("/proc/self/mountinfo"))
    if cgroups is None or mounts is None:
        return None, "no /proc/self/cgroup or /proc/self/mountinfo"
    v1_path = v2_path = None
    for line in cgroups.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if "memory" in controllers.split(","):
            v1_path = path
        elif hierarchy == "0" and controllers == "":
            v2_path = path
    v1_mount = v2_mount = None
    for line in mounts.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        mount_root, mount_point = _unescape_mount(fields[3]), _unescape_mount(fields[4])
        if tail[0] == "cgroup" and "memory" in tail[2].split(","):
            v1_mount = (mount_root, mount_point)
        elif tail[0] == "cgroup2":
            v2_mount = (mount_root, mount_point)
    if v1_path is not None and v1_mount is not None:
        path, (mount_root, mount_point), name = v1_path, v1_mount, "memory.limit_in_bytes"
    elif v2_path is not None and v2_mount is not None:
        path, (mount_root, mount_point), name = v2_path, v2_mount, "memory.max"
    else:
        return None, "the process is in no cgroup with a memory controller"
    # The cgroup's path is relative to the hierarchy's root; the mount may show a subtree.
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
        path = path[len(mount_root) :]
    directory = os.path.normpath(mount_point + "/" + path.strip("/"))
    limit, where = None, None
    while True:
        text = _read(under_root(os.path.join(directory, name)))
        if text is not None:
            value = text.strip()
            bytes_ = int(value) if value.isascii() and value.isdigit() else None
            unlimited = value == "max" or (bytes_ is not None and bytes_ >= _V1_UNLIMITED)
            if bytes_ is not None and not unlimited and (limit is None or bytes_ < limit):
                limit, where = bytes_, os.path.join(directory, name)
        if directory == os.path.normpath(mount_point) or directory in ("/", ""):
            break
        directory = os.path.dirname(directory)
    if limit is None:
        leaf = os.path.join(mount_point, path.strip("/"), name)
        return None, f"no memory limit in {leaf} or its parents"
    return limit, where


def resolve(
    limit: MemoryLimit, root: str = "/", setting: str | None = None
) -> tuple[int | None, int | None, str | None]:
    """``(traced, rss, note)``: the byte limits to watch, and, when ``cgroup:FRACTION`` could
    not be applied, the line to show on stderr, naming *setting* (where the limit came from;
    by default ``memory limit cgroup:...``, as the variable and ``run --memory-limit`` give
    it)."""
    if limit.cgroup_fraction is None:
        return limit.traced, limit.rss, None
    cgroup, where = cgroup_memory_limit(root)
    if cgroup is None:
        return (
            limit.traced,
            None,
            f"{setting or f'memory limit cgroup:{limit.cgroup_fraction:g}'}: {where}; "
            "resident memory is not watched",
        )
    return limit.traced, max(1, int(cgroup * limit.cgroup_fraction)), None


class Watcher:
    """A daemon thread that calls *on_crossing(kind, bytes)* once, when the traced total
    reaches *traced* or the peak RSS reaches *rss* (bytes; ``None``: not watched). It ends
    when stopped or when tracing stops.

    It sleeps with :func:`time.sleep` and checks with a call that allocates nothing, so that
    it leaves no trace of its own in the program's snapshots.
    """

    def __init__(self, traced: int | None, rss: int | None, on_crossing):
        self.traced = traced
        self.rss = rss
        self.on_crossing = on_crossing
        self._stopped = False

    def start(self) -> None:
        """Arm the traced limit and start watching (again, in a forked child)."""
        import threading

        from alloctrace import _native, _threads

        _native._memory_limit_arm(self.traced)
        self._stopped = False
        _threads.start(
            threading.Thread(target=self._run, name="alloctrace-memory-limit", daemon=True)
        )

    def stop(self) -> None:
        self._stopped = True

    def _run(self) -> None:
        import time

        from alloctrace import _native

        while not self._stopped and _native.is_tracing():
            time.sleep(POLL)
            try:
                crossing = _native._memory_limit_check(self.rss)
            except OSError:
                # /proc unreadable (a sandbox): resident memory cannot be watched.
                self.rss = None
                continue
            if crossing is not None and not self._stopped:
                self._stopped = True
                self.on_crossing(*crossing)


#: The limit in force (one per process): the exception hooks and the fork handler, installed
#: once, act on it.
_active: LimitDump | None = None
_hooks_installed = False


class LimitDump:
    """The one snapshot a process writes for its memory limit (or an uncaught
    :exc:`MemoryError`): *write()* writes it and returns its path (``None`` if it failed, having
    said why). *setting* names the limit in the line on stderr."""

    def __init__(self, write, limit: MemoryLimit, setting: str):
        import threading

        self.write = write
        self.limit = limit
        self.setting = setting
        self.watcher = None
        self._lock = threading.Lock()
        self._done = False

    def install(self) -> None:
        """Make this the limit in force: start its watcher (stopping the previous one) and
        install the exception hooks and fork handler if they are not yet."""
        global _active

        traced, rss, note = resolve(self.limit, setting=self.setting)
        if note is not None:
            _warn(note)
        if _active is not None and _active.watcher is not None:
            _active.watcher.stop()
        if traced is not None or rss is not None:
            self.watcher = Watcher(traced, rss, self._on_crossing)
        _active = self
        if self.watcher is not None:
            self.watcher.start()
        _install_hooks()

    def _on_crossing(self, kind: str, size: int) -> None:
        from alloctrace import _format_size

        what = "traced memory" if kind == "traced" else "resident memory (peak RSS)"
        self.dump(f"{what} reached {_format_size(size, False)} ({self.setting})")

    def dump(self, reason: str) -> None:
        """Write the snapshot for *reason*, unless one was written already or tracing is off."""
        from alloctrace import _native

        with self._lock:
            if self._done or not _native.is_tracing():
                return
            self._done = True
        if self.watcher is not None:
            self.watcher.stop()
        path = self.write()
        if path is not None:
            _warn(f"{reason}: snapshot written to {path}")

    def _check_at_exit(self) -> None:
        """A crossing the watcher has not seen yet (the process ends within a poll of it)
        still writes this snapshot, before the exit snapshot."""
        from alloctrace import _native

        watcher = self.watcher
        if watcher is None or watcher._stopped or not _native.is_tracing():
            return
        try:
            crossing = _native._memory_limit_check(watcher.rss)
        except OSError:
            return
        if crossing is not None:
            watcher.stop()
            self._on_crossing(*crossing)

    def _after_fork_in_child(self) -> None:
        import threading

        # The child is a process of its own: it gets its own snapshot for its own crossing.
        self._lock = threading.Lock()
        self._done = False
        if self.watcher is not None:
            self.watcher.start()


def deactivate() -> None:
    """No limit in force any more: ``start()`` without one, after ``stop()``, ends the previous
    one even if its watcher has not seen tracing stop yet."""
    global _active
    from alloctrace import _native

    if _active is not None and _active.watcher is not None:
        _active.watcher.stop()
    _active = None
    _native._memory_limit_arm(None)


def _install_hooks() -> None:
    """Chain ``sys.excepthook`` and ``threading.excepthook`` (an uncaught MemoryError writes
    the snapshot), check once more at exit, and re-arm in forked children; once per process.
    Registered after the start-up exit snapshot's own ``atexit`` handler, the exit check runs
    before it."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    import atexit
    import sys
    import threading

    previous_excepthook = sys.excepthook
    previous_thread_hook = threading.excepthook

    def excepthook(exc_type, exc, tb):
        if isinstance(exc, MemoryError) and _active is not None:
            _active.dump("an uncaught MemoryError")
        previous_excepthook(exc_type, exc, tb)

    def thread_excepthook(args):
        if isinstance(args.exc_value, MemoryError) and _active is not None:
            _active.dump(f"an uncaught MemoryError in thread {args.thread.name!r}")
        previous_thread_hook(args)

    def at_exit():
        if _active is not None:
            _active._check_at_exit()

    def after_fork_in_child():
        if _active is not None:
            _active._after_fork_in_child()

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
    atexit.register(at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=after_fork_in_child)
