"""Asking a running process for a snapshot: ``alloctrace snapshot PID``.

The process must have been started with ``ALLOCTRACE_SIGNAL`` and ``ALLOCTRACE_DUMP`` (see
:mod:`alloctrace._startup`): both are read from its start-up environment
(``/proc/PID/environ``), the signal is sent, and the numbered snapshot file that the process
then writes is waited for. The dump path is resolved as the process resolved it at start-up
when it is absolute; a relative one is taken from the process's current directory
(``/proc/PID/cwd``), which is the directory it started in unless it changed directory.

The variables alone do not show that the process traces: ``sleep``, ``python -E`` or a
program run with ``ALLOCTRACE=0`` carry them too, and the signal's default action would kill
them. So the signal is only sent when the process catches it (``SigCgt`` in
``/proc/PID/status``) and has alloctrace's native module loaded (``/proc/PID/maps``).
"""

from __future__ import annotations

import glob
import os
import string
import time

from . import _startup

#: How long ``alloctrace snapshot`` waits for the file by default, in seconds.
DEFAULT_TIMEOUT = 30.0


class RequestError(Exception):
    """A snapshot could not be asked for or did not arrive; the message says why."""


def _environment(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as stream:
            raw = stream.read()
    except FileNotFoundError:
        raise RequestError(f"no process {pid}") from None
    except PermissionError:
        raise RequestError(
            f"cannot read the environment of process {pid}: permission denied"
        ) from None
    environ = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            environ[os.fsdecode(name)] = os.fsdecode(value)
    return environ


def _disposition(pid: int, signum: int) -> str:
    """``"caught"``, ``"ignored"`` or ``"default"``: what process *pid* does with *signum*."""
    masks = {}
    try:
        with open(f"/proc/{pid}/status", "rb") as stream:
            for line in stream:
                name, _, value = line.partition(b":")
                if name in (b"SigCgt", b"SigIgn"):
                    masks[name] = int(value.strip(), 16)
    except FileNotFoundError:
        raise RequestError(f"no process {pid}") from None
    except (OSError, ValueError):
        pass
    if len(masks) != 2:
        raise RequestError(f"cannot read the signal handlers of process {pid}")
    bit = 1 << (signum - 1)
    if masks[b"SigCgt"] & bit:
        return "caught"
    return "ignored" if masks[b"SigIgn"] & bit else "default"


def _loads_alloctrace(pid: int) -> bool | None:
    """Whether process *pid* has alloctrace's native module mapped; ``None`` if unknown."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as stream:
            return any(b"/alloctrace/_native" in line for line in stream)
    except OSError:
        return None


def _check_handler(pid: int, signum: int) -> None:
    """Refuse to signal a process whose handler for *signum* is not alloctrace's."""
    name = _signal_name(signum)
    disposition = _disposition(pid, signum)
    if disposition == "ignored":
        raise RequestError(f"process {pid} ignores {name}: not signalled")
    if disposition == "default":
        raise RequestError(
            f"process {pid} has no handler for {name}, so it would die of it: not signalled. "
            "It carries the variables but does not trace (ALLOCTRACE=0, python -E or -I, not "
            "a Python program, or still starting)"
        )
    if _loads_alloctrace(pid) is False:
        raise RequestError(
            f"process {pid} handles {name} itself and has not loaded alloctrace: not signalled"
        )


def _pattern(template: str, pid: int) -> str:
    """A glob for the numbered snapshots of *pid* that *template* names."""
    parts = []
    has_n = False
    for literal, field, _, _ in string.Formatter().parse(template):
        parts.append(glob.escape(literal))
        if field == "pid":
            parts.append(str(pid))
        elif field is not None:
            has_n = has_n or field == "n"
            parts.append("*")
    pattern = "".join(parts)
    # A template without {n} gets ".N" appended to its numbered snapshots.
    return pattern if has_n else pattern + ".*"


def _mtimes(pattern: str) -> dict[str, int]:
    found = {}
    for path in glob.glob(pattern):
        try:
            found[path] = os.stat(path).st_mtime_ns
        except OSError:
            pass
    return found


def request_snapshot(pid: int, timeout: float = DEFAULT_TIMEOUT) -> str:
    """Signal process *pid* to write a snapshot and return the file's path once written.

    Raise :class:`RequestError` if the process does not exist, was not started with
    ``ALLOCTRACE_SIGNAL`` and ``ALLOCTRACE_DUMP``, has no alloctrace handler for the signal
    (then it is not signalled), or writes nothing within *timeout* seconds (it may handle the
    signal itself, or have stopped tracing).
    """
    environ = _environment(pid)
    value = environ.get(_startup.ENV_SIGNAL, "")
    template = environ.get(_startup.ENV_DUMP, "")
    if not value or not template:
        missing = _startup.ENV_SIGNAL if not value else _startup.ENV_DUMP
        raise RequestError(
            f"process {pid} was not started with {missing}: start it with "
            f"{_startup.ENV_SIGNAL}=SIGUSR2 {_startup.ENV_DUMP}=PATH to take snapshots on demand"
        )
    try:
        signum = _startup.parse_signal(value)
        _startup.check_path_template(template)
    except _startup.ConfigError as exc:
        raise RequestError(f"process {pid}: {exc}") from None
    if not os.path.isabs(template):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError as exc:
            raise RequestError(
                f"cannot find where process {pid} writes {template}: {exc.strerror or exc}"
            ) from None
        template = os.path.join(cwd, template)
    pattern = _pattern(template, pid)
    before = _mtimes(pattern)
    _check_handler(pid, signum)
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        raise RequestError(f"no process {pid}") from None
    except PermissionError:
        raise RequestError(f"cannot signal process {pid}: permission denied") from None
    deadline = time.monotonic() + timeout
    while True:
        # Dumps are renamed into place whole, so a new name or time means a complete file.
        fresh = [p for p, m in _mtimes(pattern).items() if before.get(p) != m]
        if fresh:
            return max(fresh, key=lambda p: os.stat(p).st_mtime_ns)
        if time.monotonic() >= deadline:
            alive = os.path.exists(f"/proc/{pid}")
            why = (
                "the program may handle the signal itself, or have stopped tracing"
                if alive
                else "the process has ended"
            )
            raise RequestError(
                f"process {pid} wrote no snapshot matching {pattern} within {timeout:g} s "
                f"of {_signal_name(signum)} ({why})"
            )
        time.sleep(0.05)


def _signal_name(signum: int) -> str:
    import signal

    return signal.Signals(signum).name
