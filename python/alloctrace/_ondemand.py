"""Asking a running process for a snapshot: ``alloctrace snapshot PID``.

The process must have been started with ``ALLOCTRACE_SIGNAL`` and ``ALLOCTRACE_DUMP`` (see
:mod:`alloctrace._startup`; ``alloctrace run --signal`` sets both for its program, and the pid of
``run`` stands for its program's), or be traced by ``alloctrace attach``, which leaves a record
of its signal and path (see :mod:`alloctrace._attach_target`). The variables are read from its
start-up environment (``/proc/PID/environ``), the signal is sent, and the numbered snapshot
file that the process then writes is waited for. The dump path is resolved as the process
resolved it at start-up when it is absolute; a relative one is taken from the process's current
directory (``/proc/PID/cwd``), which is the directory it started in unless it changed directory.

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


class NotSetUp(RequestError):
    """The process cannot be asked at all (it does not exist, or has no snapshot signal):
    asking again later would not help."""


def _environment(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as stream:
            raw = stream.read()
    except FileNotFoundError:
        raise NotSetUp(f"no process {pid}") from None
    except ProcessLookupError:
        # A zombie: it has exited, and its parent has not collected it yet.
        raise NotSetUp(f"process {pid} has exited") from None
    except PermissionError:
        raise NotSetUp(f"cannot read the environment of process {pid}: permission denied") from None
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
    if has_n:
        return pattern
    # A template without {n} gets ".N" before its extension in its numbered snapshots.
    root, extension = os.path.splitext(pattern)
    return f"{root}.*{extension}"


def _mtimes(pattern: str) -> dict[str, int]:
    found = {}
    for path in glob.glob(pattern):
        try:
            found[path] = os.stat(path).st_mtime_ns
        except OSError:
            pass
    return found


def _settings(pid: int) -> tuple[int, int, str]:
    """The process to signal, the signal and the absolute dump path template for *pid*: from
    its start-up environment, from the record ``alloctrace attach`` left, or, for the pid of
    ``alloctrace run``, from the program it runs."""
    environ = _environment(pid)
    value = environ.get(_startup.ENV_SIGNAL, "")
    template = environ.get(_startup.ENV_DUMP, "")
    if not value or not template:
        attached = _attached(pid)
        if attached is not None:
            return pid, attached[0], attached[1]
        child = _run_child(pid)
        if child is not None:
            return _settings(child)
        missing = _startup.ENV_SIGNAL if not value else _startup.ENV_DUMP
        raise NotSetUp(
            f"process {pid} was not started with {missing} and is not traced by 'alloctrace "
            f"attach': start it with {_startup.ENV_SIGNAL}=SIGUSR2 {_startup.ENV_DUMP}=PATH "
            "or 'alloctrace run --signal SIGUSR2', or attach to it first"
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
    return pid, signum, template


def _attached(pid: int) -> tuple[int, str] | None:
    """The signal and dump template ``alloctrace attach`` recorded for *pid*, if it is the
    same process (same start time) and the record is its owner's."""
    import json

    from . import _attach_target

    try:
        with open(f"/proc/{pid}/status") as stream:
            uid = int(next(line for line in stream if line.startswith("Uid:")).split()[2])
        root = "" if _same_namespace(pid) else f"/proc/{pid}/root"
        path = _attach_target.state_path(uid, pid, root)
        with open(path) as stream:
            if os.fstat(stream.fileno()).st_uid != uid:
                return None
            record = json.load(stream)
        if record.get("start") != _attach_target.start_time(pid):
            return None
        return int(record["signal"]), str(root + record["dump"])
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        return None


def _same_namespace(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/mnt").st_ino == os.stat("/proc/self/ns/mnt").st_ino
    except OSError:
        return True


def _run_child(pid: int) -> int | None:
    """The program's pid when *pid* is ``alloctrace run`` (its one child), else ``None``."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as stream:
            argv = os.fsdecode(stream.read()).split("\0")[:-1]
    except OSError:
        return None
    if not _startup.is_command_line_tool(argv):
        return None
    # The command's own word: the first argument after "alloctrace" or "-m alloctrace".
    words = [arg for arg in argv[1:] if not arg.startswith("-")]
    if "run" not in words[:3]:
        return None
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stream:
                stat = stream.read()
        except OSError:
            continue
        if int(stat[stat.rindex(b")") + 2 :].split()[1]) == pid:
            children.append(int(entry))
    if len(children) != 1:
        return None
    return children[0]


def request_snapshot(pid: int, timeout: float = DEFAULT_TIMEOUT) -> str:
    """Signal process *pid* to write a snapshot and return the file's path once written.

    Raise :class:`RequestError` if the process does not exist, was neither started with
    ``ALLOCTRACE_SIGNAL`` and ``ALLOCTRACE_DUMP`` (``alloctrace run --signal`` sets them; its
    own pid stands for its program's) nor attached to by ``alloctrace attach``, or writes
    nothing within *timeout* seconds (it may handle the signal itself, or have stopped tracing).
    """
    pid, signum, template = _settings(pid)
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
