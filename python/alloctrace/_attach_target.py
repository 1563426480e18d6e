"""The side of ``alloctrace attach`` and ``alloctrace detach`` that runs inside the target.

A debugger (see :mod:`alloctrace._attach`) only schedules a few lines of Python as a pending
call; the interpreter runs them in the main thread, with the GIL, between two bytecodes, which
is where starting tracing and installing a signal handler are as safe as anywhere in the
program. Those lines claim the request (a rename, so that a request the command gave up on is
never acted on late), import this module from the target's own ``sys.path`` and call
:func:`handle`, which does the work and writes the one status file the command waits for.
Nothing here may raise out of :func:`handle`: an exception escaping a pending call would be
raised in the program's own code.
"""

from __future__ import annotations

import json
import os
import sys

#: Bumped whenever the request or status files change, so that a target whose alloctrace is
#: another version refuses what it cannot read instead of misreading it.
PROTOCOL = 1

#: The request as renamed by the bootstrap lines once claimed, and the status written back.
CLAIMED = "claimed.json"
STATUS = "status.json"
FINISHED = "finished.json"


class Refused(Exception):
    """The request cannot be carried out; the message says why, for the user."""


class _Attached:
    """What one ``alloctrace attach`` set up in this process, to be undone by ``detach``."""

    def __init__(self, dumper, signum, state_path, stop_event):
        self.dumper = dumper
        self.signum = signum
        self.state_path = state_path
        self.stop_event = stop_event


_attached: _Attached | None = None


def state_path(uid: int, pid: int, root: str = "") -> str:
    """Where an attached process records its signal and dump path for ``alloctrace snapshot``
    (*root* is ``/proc/PID/root`` when read from another mount namespace)."""
    return f"{root}/tmp/alloctrace-{uid}/attached-{pid}.json"


def start_time(pid: int | str = "self") -> str:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22): with
    the pid, it names one process even after the pid is reused."""
    with open(f"/proc/{pid}/stat", "rb") as stream:
        stat = stream.read()
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    return stat[stat.rindex(b")") + 2 :].split()[19].decode()


def _write_json(directory: str, name: str, document: dict) -> None:
    temporary = os.path.join(directory, "." + name)
    with open(temporary, "w") as stream:
        json.dump(document, stream)
    os.replace(temporary, os.path.join(directory, name))


def handle(directory: str) -> None:
    """Carry out the claimed request in *directory* and write its status there."""
    try:
        with open(os.path.join(directory, CLAIMED)) as stream:
            request = json.load(stream)
        if request.get("protocol") != PROTOCOL:
            import alloctrace

            raise Refused(
                f"the alloctrace installed for this process (version {alloctrace.__version__}) "
                "does not understand this command's request: use the alloctrace command of the "
                f"same version ({sys.executable} -m alloctrace)"
            )
        action = request["action"]
        if action == "start":
            result = _start(request, directory)
        elif action == "stop":
            result = _stop()
        else:
            raise Refused(f"unknown request {action!r}")
        status = {"ok": True, **result}
    except Refused as exc:
        status = {"ok": False, "error": str(exc)}
    except BaseException as exc:
        status = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    try:
        _write_json(directory, STATUS, status)
    except OSError:
        # The command gave up and removed the directory: nobody is left to tell.
        pass


def _start(request: dict, directory: str) -> dict:
    global _attached
    import signal
    import threading
    import tracemalloc

    import alloctrace

    from . import _startup, _threads

    if _attached is not None:
        raise Refused("already traced by 'alloctrace attach': run 'alloctrace detach' first")
    if alloctrace.is_tracing():
        raise Refused(
            "already traced by alloctrace (started by the program or by ALLOCTRACE at start-up)"
        )
    if tracemalloc.is_tracing():
        raise Refused(
            "already traced by tracemalloc: attach alloctrace once the program has called "
            "tracemalloc.stop()"
        )
    template = request["dump"]
    folder = os.path.dirname(template) or "."
    if not os.access(folder, os.W_OK | os.X_OK):
        raise Refused(
            f"the process (user id {os.geteuid()}) cannot write snapshots into {folder}: "
            "give another place with -o"
        )
    signum = request.get("signal")
    if signum is not None and signal.getsignal(signum) != signal.SIG_DFL:
        name = signal.Signals(signum).name
        raise Refused(f"the program handles or ignores {name} itself: choose another --signal")
    duration = request.get("duration")
    dumper = _startup.Dumper(template, None)
    # A second attach continues the numbering of the first one's files instead of
    # overwriting them.
    while os.path.exists(_startup.expand_path(template, pid=os.getpid(), n=dumper._count + 1)):
        dumper._count += 1
    alloctrace.start(
        request["nframe"],
        sample_interval=request.get("sample_interval"),
        native=request.get("native", False),
    )
    # Our own set-up is not the program's memory.
    alloctrace.disable()
    try:
        stop_event = threading.Event()
        path = None
        if signum is not None:
            dumper.install_signal(signum)
            path = state_path(os.geteuid(), os.getpid())
            _record_state(path, signum, dumper.template)
        _attached = _Attached(dumper, signum, path, stop_event)
        if duration is not None:
            output = _startup.expand_path(request["output"], pid=os.getpid())
            thread = threading.Thread(
                target=_finish_after,
                args=(_attached, duration, output, directory),
                name="alloctrace-attach-duration",
                daemon=True,
            )
            _threads.start(thread)
    except BaseException:
        alloctrace.enable()
        _undo()
        raise
    alloctrace.enable()
    return {
        "executable": sys.executable,
        "version": "{}.{}.{}".format(*sys.version_info[:3]),
        "alloctrace": alloctrace.__version__,
    }


def _record_state(path: str, signum: int, template: str) -> None:
    folder = os.path.dirname(path)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(folder)
    import stat

    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise Refused(
            f"{folder} is not a private directory of this user: remove it and attach again"
        )
    _write_json(
        folder,
        os.path.basename(path),
        {"pid": os.getpid(), "start": start_time(), "signal": signum, "dump": template},
    )


def _finish_after(attached: _Attached, duration: float, output: str, directory: str) -> None:
    """The ``--duration`` thread: write the snapshot, stop tracing and say so."""
    global _attached
    if attached.stop_event.wait(duration):
        return  # detached meanwhile
    if attached.dumper._write(output):
        status = {"ok": True, "path": output}
    else:
        status = {"ok": False, "error": f"cannot write the snapshot to {output} (see its stderr)"}
    if _attached is attached:
        _undo()
    try:
        _write_json(directory, FINISHED, status)
    except OSError:
        pass


def _undo() -> None:
    """Stop what :func:`_start` set up, as far as it got."""
    global _attached
    import signal

    import alloctrace
    from alloctrace._signals import set_handler

    attached, _attached = _attached, None
    if attached is not None:
        attached.stop_event.set()
        if attached.signum is not None:
            try:
                if signal.getsignal(attached.signum) == attached.dumper._on_request:
                    set_handler(attached.signum, signal.SIG_DFL)
            except ValueError:
                pass  # not the main thread (the --duration thread): no handler was installed
            attached.dumper.stop_requests()
        if attached.state_path is not None:
            try:
                os.unlink(attached.state_path)
            except OSError:
                pass
    if alloctrace.is_tracing():
        alloctrace.stop()


def _stop() -> dict:
    import alloctrace

    if _attached is None:
        if alloctrace.is_tracing():
            raise Refused(
                "traced by the program's own alloctrace (not by 'alloctrace attach'): left as it is"
            )
        raise Refused("not traced by alloctrace: nothing to detach")
    _undo()
    return {}
