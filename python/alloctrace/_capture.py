"""Captures: one directory for a whole process tree, each process's snapshots and a manifest.

A program traced with ``ALLOCTRACE_CAPTURE=DIR`` (what ``alloctrace run`` sets by default) is
many processes as often as one: ``multiprocessing`` pools with any start method, pre-fork
servers, Python subprocesses. Every traced process writes its snapshots into DIR, named
``PID-MILLIS.snap`` after its process id and start time (so that a reused process id never
overwrites an earlier process's file), and appends what happens to it to ``DIR/manifest.jsonl``,
one JSON object a line:

``start``
    A process began tracing: ``id``, ``pid``, ``ppid``, ``argv`` (the interpreter's command
    line), ``time``, ``how`` (``"start"`` for an interpreter, ``"fork"`` for a forked child)
    and ``file``, the name its exit snapshot will have.
``snapshot``
    A snapshot file was written (``file``; ``n`` for numbered ones, ``null`` for the exit one).
``end``
    The exit snapshot is in place: ``how`` the process was ending (``"exit"``, a signal name
    such as ``"SIGTERM"``, or ``"exec"``) and its :mod:`multiprocessing` process ``name``.
``reaped``
    A traced process collected a child's exit status through ``os.wait``, ``os.waitpid``,
    ``os.wait3``, ``os.wait4`` or ``os.waitid`` (``pid``, ``by``, ``code`` or ``signal``);
    ``alloctrace run`` writes one for the program itself.
``spawn`` / ``exec``
    A traced process started a program with :mod:`subprocess`, or replaced itself with
    ``os.exec*`` (``argv``): a Python program that could not import alloctrace then shows up
    as one that never started tracing, and is named as such.
``dropped``
    The snapshot files of an ended process (``id``) were removed to keep the capture bounded
    (``files``; ``by``, the pid of the process that removed them; ``keep``, the bound): see
    :meth:`Recorder.prune`. Its ``end`` record still gives its figures.

The ``end`` record carries the process's figures at exit (``size`` and ``count``, traced
memory and blocks in its exit snapshot, and ``peak``, the traced total at its peak, as
``alloctrace stats`` computes them), so that a process whose snapshot files were dropped is
still counted in the summary.

Each record is one ``write`` on a file opened with ``O_APPEND``, short enough (argv is cut
to fit) that concurrent writers never interleave within a line. Removing files to keep the
capture bounded takes an exclusive :func:`fcntl.flock` on the manifest, so that processes
ending at once take turns (:meth:`Recorder.prune`). A process with a ``start`` record and no
``end`` record was killed (SIGKILL, the OOM killer), left through ``os._exit``
or crashed before it could write its exit snapshot: :func:`load_capture` lists it as such,
with the status its parent saw when that parent was traced, and with its last numbered
snapshot if it wrote any.

:func:`merge_snapshots` and :func:`combined_statistics` sum snapshots of several processes.
"""

from __future__ import annotations

import os
import sys
import time

#: The manifest's name inside a capture directory.
MANIFEST = "manifest.jsonl"
#: The ended processes that keep their snapshot files, in a capture bounded by
#: ``ALLOCTRACE_CAPTURE_KEEP``: a JSON list of ``{"id", "ppid", "ended", "files"}``, rewritten
#: (write and rename) under the manifest's lock by each process as it ends.
KEPT = ".kept.json"
#: ``PID DIR``: set by the first process that traces into capture DIR, inherited by the
#: processes it starts, so that each knows whether it is the top of the tree.
ENV_ROOT = "ALLOCTRACE_CAPTURE_ROOT"
ENV_CAPTURE = "ALLOCTRACE_CAPTURE"
#: How many ended processes keep their snapshot files in a capture, unless
#: ``ALLOCTRACE_CAPTURE_KEEP`` (``run --capture-keep``) says otherwise (see :meth:`Recorder.prune`).
DEFAULT_KEEP = 100
#: Records are cut to stay below this size, well under the 4 KiB a single append keeps whole.
_RECORD_MAX = 3000
_ARGV_ITEM_MAX = 200


def _now() -> float:
    return round(time.time(), 6)


def _interpreter_argv() -> list[str]:
    argv = getattr(sys, "orig_argv", None)
    if argv is None:
        try:
            with open("/proc/self/cmdline", "rb") as file:
                argv = os.fsdecode(file.read()).split("\0")[:-1]
        except OSError:
            argv = list(sys.argv)
    return list(argv)


def _cut_argv(argv) -> list[str]:
    out = []
    used = 0
    for item in argv:
        text = os.fsdecode(item) if isinstance(item, bytes) else str(item)
        if len(text) > _ARGV_ITEM_MAX:
            text = text[: _ARGV_ITEM_MAX - 3] + "..."
        used += len(text) + 4
        if used > _RECORD_MAX // 2:
            out.append("...")
            break
        out.append(text)
    return out


def _victim(kept: list) -> dict:
    """The entry of :data:`KEPT` whose files go next: the earliest-ended child of the parent
    with the most entries (of equal parents, the one whose first child ended first)."""
    groups: dict = {}
    for entry in kept:
        groups.setdefault(entry.get("ppid"), []).append(entry)

    def ended(entry) -> float:
        return _float(entry.get("ended"))

    for members in groups.values():
        members.sort(key=ended)
    busiest = max(groups.values(), key=lambda members: (len(members), -ended(members[0])))
    return busiest[0]


def _signal_name(number: int) -> str:
    try:
        import signal

        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _status_fields(status: int) -> dict:
    if os.WIFSIGNALED(status):
        return {"signal": _signal_name(os.WTERMSIG(status))}
    if os.WIFEXITED(status):
        return {"code": os.WEXITSTATUS(status)}
    return {}


class Recorder:
    """Writes this process's records into a capture directory, and names its snapshot files.

    *keep* bounds the capture: at most that many ended processes keep their snapshot files
    (``0``: no bound; see :meth:`prune`).
    """

    def __init__(self, directory: str, keep: int = DEFAULT_KEEP):
        self.directory = os.path.abspath(directory)
        self.manifest = os.path.join(self.directory, MANIFEST)
        self.keep = keep
        self.id = ""
        self._wrapped = False

    def begin(self, how: str) -> None:
        """A process starts tracing (``"start"``) or was just forked (``"fork"``)."""
        started = time.time()
        self.pid = os.getpid()
        self.id = f"{self.pid}-{int(started * 1000)}"
        #: This process's numbered snapshot files so far (names).
        self.files: list[str] = []
        root = os.environ.get(ENV_ROOT, "").partition(" ")
        if how == "start" and root[2] != self.directory:
            # The first traced process of this capture: the top of its tree.
            os.environ[ENV_ROOT] = f"{self.pid} {self.directory}"
            root = (str(self.pid), "", self.directory)
        #: The pid of the process at the top of the tree, whose files are never dropped.
        self.root = int(root[0]) if root[0].isdigit() else None
        self.write(
            "start",
            ppid=os.getppid(),
            argv=_cut_argv(_interpreter_argv()),
            how=how,
            file=os.path.basename(self.template()),
            python=".".join(map(str, sys.version_info[:3])),
        )

    def template(self) -> str:
        """This process's snapshot path, for :class:`alloctrace._startup.Dumper`."""
        return os.path.join(self.directory, f"{self.id}.snap")

    def write(self, event: str, **fields) -> None:
        import json

        record = {"event": event, "id": self.id, "pid": os.getpid(), "time": _now()}
        record.update(fields)
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        try:
            fd = os.open(
                self.manifest, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            from alloctrace._startup import _warn

            _warn(f"cannot write to {self.manifest}: {exc.strerror or exc}")

    def snapshot_written(self, path: str, n: int | None) -> None:
        self.write("snapshot", file=os.path.basename(path), n=n)
        if n is not None:
            self.files.append(os.path.basename(path))

    def ended(self, how: str, path: str | None, figures: dict | None = None) -> None:
        """The exit snapshot is in place (*path*, ``None`` if it could not be written);
        *figures* (``size``, ``count``, ``peak``) go into the record. Then the capture is
        trimmed to its bound (:meth:`prune`)."""
        name = None
        process = sys.modules.get("multiprocessing.process")
        if process is not None:
            try:
                name = process.current_process().name
            except Exception:
                name = None
        self.write(
            "end",
            how=how,
            file=None if path is None else os.path.basename(path),
            name=name,
            **(figures or {}),
        )
        if self.keep and path is not None and self.pid != self.root:
            entry = {
                "id": self.id,
                "ppid": os.getppid(),
                "ended": _now(),
                "files": [*self.files, os.path.basename(path)],
            }
            try:
                self.prune(entry)
            except Exception as exc:
                from alloctrace._startup import _warn

                _warn(f"cannot trim the capture {self.directory}: {exc}")

    def prune(self, entry: dict | None = None) -> list[str]:
        """Keep the capture bounded: add *entry* (this process, just ended: see
        :meth:`ended`) to the ended processes that keep their files, then, while there are
        more than :attr:`keep` of them, remove the files of the earliest-ended child of the
        parent with the most such children (a server's recycled workers go first, one-off
        children last); return the ids of the processes whose files went.

        Never removed: the files of the process at the top of the tree (the program the
        capture was made for; :data:`ENV_ROOT`), of processes still running, and of processes
        that ended without their exit snapshot (killed: their last numbered snapshot is the
        only evidence). A ``dropped`` record is written before the files go; the process's
        ``end`` record keeps its figures.

        Processes ending at once take turns: an exclusive :func:`fcntl.flock` on the
        manifest guards :data:`KEPT`, the list of the ended processes that keep their files
        (at most *keep* entries, so the work per exit is bounded whatever the number of
        processes the capture has seen; the manifest is never read here). Records are still
        appended without the lock.
        """
        import fcntl
        import json

        if not self.keep:
            return []
        fd = os.open(self.manifest, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            path = os.path.join(self.directory, KEPT)
            try:
                with open(path, "rb") as file:
                    kept = [e for e in json.loads(file.read()) if isinstance(e, dict)]
            except (OSError, ValueError, TypeError):
                kept = []
            if entry is not None:
                kept.append(entry)
            dropped = []
            while len(kept) > self.keep:
                victim = _victim(kept)
                kept.remove(victim)
                # Only snapshot files, and only inside the capture, whatever the list says.
                files = [
                    name
                    for name in victim.get("files", ())
                    if _safe_name(self.directory, name) and name.endswith(".snap")
                ]
                self.write(
                    "dropped", id=str(victim.get("id")), files=files, by=os.getpid(), keep=self.keep
                )
                for name in files:
                    try:
                        os.unlink(os.path.join(self.directory, name))
                    except FileNotFoundError:
                        pass
                dropped.append(str(victim.get("id")))
            temporary = f"{path}.{os.getpid()}.tmp"
            out = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with open(out, "w") as file:
                file.write(json.dumps(kept, separators=(",", ":")))
            os.replace(temporary, path)
            return dropped
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ children

    def watch_children(self) -> None:
        """Record the children this process reaps, starts with subprocess, or execs into."""
        if self._wrapped:
            return
        self._wrapped = True
        recorder = self
        for name in ("wait", "waitpid", "wait3", "wait4"):
            original = getattr(os, name, None)
            if original is not None:
                setattr(os, name, _reaping(original, recorder))
        if hasattr(os, "waitid"):
            os.waitid = _reaping_waitid(os.waitid, recorder)
        for name in ("execv", "execve"):
            original = getattr(os, name, None)
            if original is not None:
                setattr(os, name, _execing(original, recorder))
        from alloctrace._after_import import when_imported

        when_imported("subprocess", lambda module: _watch_popen(module, recorder))


#: Called before an ``os.exec*`` replaces the process: writes its exit snapshot.
on_exec = None
#: Called when that ``os.exec*`` failed and the process goes on: its exit snapshot is due again.
on_exec_failed = None


def _reaping(original, recorder: Recorder):
    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        try:
            pid, status = result[0], result[1]
            if pid > 0:
                recorder.write("reaped", pid=pid, by=os.getpid(), **_status_fields(status))
        except Exception:
            pass
        return result

    wrapper.__name__ = original.__name__
    wrapper.__doc__ = original.__doc__
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapper


def _reaping_waitid(original, recorder: Recorder):
    """``os.waitid``: its result is a ``waitid_result`` (``None`` with ``WNOHANG`` and no child
    ready); a child it leaves waitable (``WNOWAIT``) or that only stopped or continued is not
    reaped yet."""

    def wrapper(idtype, ident, options, /):
        result = original(idtype, ident, options)
        try:
            if result is not None and not options & getattr(os, "WNOWAIT", 0):
                fields = None
                if result.si_code == os.CLD_EXITED:
                    fields = {"code": result.si_status}
                elif result.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
                    # si_status is the signal's number here, not a wait status.
                    fields = {"signal": _signal_name(result.si_status)}
                if fields is not None and result.si_pid > 0:
                    recorder.write("reaped", pid=result.si_pid, by=os.getpid(), **fields)
        except Exception:
            pass
        return result

    wrapper.__name__ = original.__name__
    wrapper.__doc__ = original.__doc__
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapper


def _execing(original, recorder: Recorder):
    def wrapper(path, args, *rest):
        try:
            recorder.write("exec", argv=_cut_argv(args))
            if on_exec is not None:
                on_exec()
        except Exception:
            pass
        try:
            return original(path, args, *rest)
        except BaseException:
            recorder.write("exec_failed")
            if on_exec_failed is not None:
                on_exec_failed()
            raise

    wrapper.__name__ = original.__name__
    wrapper.__doc__ = original.__doc__
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapper


def _watch_popen(module, recorder: Recorder) -> None:
    popen = getattr(module, "Popen", None)
    original = getattr(popen, "_execute_child", None)
    if original is None or getattr(original, "_alloctrace_watches", False):
        return

    def _execute_child(self, args, *rest, **kwargs):
        original(self, args, *rest, **kwargs)
        try:
            argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
            recorder.write("spawn", child=self.pid, argv=_cut_argv(map(os.fspath, argv)))
        except Exception:
            pass

    _execute_child._alloctrace_watches = True  # type: ignore[attr-defined]
    popen._execute_child = _execute_child


# ---------------------------------------------------------------------- reading a capture


class CaptureProcess:
    """One process of a capture, as its manifest records tell it."""

    __slots__ = (
        "id",
        "pid",
        "ppid",
        "argv",
        "how",
        "started",
        "ended",
        "end_how",
        "name",
        "code",
        "signal",
        "snapshot",
        "numbered",
        "exec_argv",
        "dropped",
        "size",
        "count",
        "peak",
    )

    def __init__(self, record: dict):
        self.id = str(record.get("id", ""))
        self.pid = _int(record.get("pid"))
        self.ppid = _int(record.get("ppid"))
        argv = record.get("argv")
        self.argv = [str(a) for a in argv] if isinstance(argv, list) else []
        self.how = str(record.get("how", "start"))
        self.started = _float(record.get("time"))
        self.ended: float | None = None
        self.end_how: str | None = None
        self.name: str | None = None
        self.code: int | None = None
        self.signal: str | None = None
        #: Path of the exit snapshot, when it was written.
        self.snapshot: str | None = None
        #: Paths of the numbered snapshots, oldest first.
        self.numbered: list[str] = []
        self.exec_argv: list[str] | None = None
        #: Whether its snapshot files were removed to keep the capture bounded.
        self.dropped = False
        #: Traced memory and blocks in its exit snapshot, and its peak traced total, as its
        #: ``end`` record gives them (``None`` where it does not: older captures).
        self.size: int | None = None
        self.count: int | None = None
        self.peak: int | None = None

    @property
    def killed(self) -> bool:
        """Whether the process ended without writing its exit snapshot."""
        return self.ended is None

    @property
    def last_snapshot(self) -> str | None:
        """The exit snapshot, or for a killed process its last numbered one."""
        if self.snapshot is not None:
            return self.snapshot
        return self.numbered[-1] if self.numbered else None

    @property
    def role(self) -> str:
        """What the process was, for people: its multiprocessing name, ``fork of PID``, the
        multiprocessing helper it ran, or its command line."""
        if self.name and self.name != "MainProcess":
            return self.name
        text = " ".join(self.argv)
        if "multiprocessing.resource_tracker" in text:
            return "resource tracker"
        if "multiprocessing.forkserver" in text:
            return "forkserver"
        if self.how == "fork":
            return f"fork of {self.ppid}"
        args = self.argv[1:]
        while args and args[0].startswith("-") and args[0] not in ("-c", "-m"):
            args = args[2:] if args[0] in ("-X", "-W") else args[1:]
        if args and args[0] not in ("-c", "-m") and args[0].endswith(".py"):
            args = [os.path.basename(args[0]), *args[1:]]
        return " ".join(args) or text or "?"

    @property
    def ending(self) -> str:
        """How the process ended, in words."""
        if self.signal is not None:
            status = f"killed by {self.signal}"
        elif self.code is not None:
            status = f"exit {self.code}"
        else:
            status = None
        if self.end_how == "exec":
            return "exec'd " + " ".join(self.exec_argv or [])[:60]
        if self.killed:
            if status is None:
                return "no exit snapshot (killed, os._exit, or still running)"
            return f"{status}, before its exit snapshot"
        if status is None:
            status = self.end_how if self.end_how not in (None, "exit") else "exit"
        return status + ("; snapshot dropped (capture bound)" if self.dropped else "")

    def __repr__(self) -> str:
        return f"<CaptureProcess pid={self.pid} role={self.role!r} {self.ending}>"


class Capture:
    """A capture directory read back: its processes, oldest first (see :func:`load_capture`)."""

    def __init__(self, directory: str, processes: list, untraced: list, problems: list):
        self.directory = directory
        #: :class:`CaptureProcess` objects, in the order they started.
        self.processes = processes
        #: ``(pid, argv, parent pid)`` of children started with subprocess or ``os.exec*``
        #: that never started tracing: not Python, or a Python that cannot import alloctrace.
        self.untraced = untraced
        #: Lines of the manifest that could not be read.
        self.problems = problems

    @property
    def root(self):
        return self.processes[0] if self.processes else None

    def __repr__(self) -> str:
        return f"<Capture {self.directory!r} processes={len(self.processes)}>"


def _int(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _size(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _float(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _safe_name(directory: str, name) -> str | None:
    """*name* inside *directory*, refusing anything that is not a plain file name: a
    manifest from someone else must not point the reader elsewhere."""
    if not isinstance(name, str) or not name or name != os.path.basename(name):
        return None
    if name in (".", "..") or "\0" in name:
        return None
    return os.path.join(directory, name)


def is_capture(path: str) -> bool:
    """Whether *path* is a capture directory (it holds a manifest)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST))


def load_capture(directory: str) -> Capture:
    """Read a capture directory's manifest into a :class:`Capture`.

    Raises :exc:`OSError` when there is no manifest to read; a line that is not a record is
    skipped and listed in :attr:`Capture.problems`.
    """
    import json

    directory = os.fspath(directory)
    with open(os.path.join(directory, MANIFEST), "rb") as file:
        data = file.read()
    processes: list[CaptureProcess] = []
    by_id: dict[str, CaptureProcess] = {}
    spawned: list[tuple[int, list[str], int, float]] = []
    execs: list[tuple[CaptureProcess, float]] = []
    reaped: list[dict] = []
    problems: list[str] = []
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            problems.append(f"line {number}: not JSON")
            continue
        if not isinstance(record, dict):
            problems.append(f"line {number}: not a record")
            continue
        event = record.get("event")
        if event == "start":
            process = CaptureProcess(record)
            processes.append(process)
            by_id[process.id] = process
            continue
        if event == "reaped":
            reaped.append(record)
            continue
        if event == "spawn":
            argv = record.get("argv")
            spawned.append(
                (
                    _int(record.get("child")),
                    [str(a) for a in argv] if isinstance(argv, list) else [],
                    _int(record.get("pid")),
                    _float(record.get("time")),
                )
            )
            continue
        process = by_id.get(str(record.get("id", "")))
        if process is None:
            problems.append(f"line {number}: {event!r} record of an unknown process")
            continue
        if event == "snapshot":
            path = _safe_name(directory, record.get("file"))
            if path is None:
                problems.append(f"line {number}: bad file name")
            elif process.dropped:
                pass
            elif record.get("n") is None:
                process.snapshot = path
            else:
                process.numbered.append(path)
        elif event == "end":
            process.ended = _float(record.get("time"))
            how = record.get("how")
            process.end_how = how if isinstance(how, str) else "exit"
            name = record.get("name")
            process.name = name if isinstance(name, str) else None
            path = _safe_name(directory, record.get("file"))
            if path is not None and not process.dropped:
                process.snapshot = path
            process.size = _size(record.get("size"))
            process.count = _size(record.get("count"))
            process.peak = _size(record.get("peak"))
        elif event == "dropped":
            process.dropped = True
            process.snapshot = None
            process.numbered = []
        elif event == "exec":
            argv = record.get("argv")
            process.exec_argv = [str(a) for a in argv] if isinstance(argv, list) else []
            execs.append((process, _float(record.get("time"))))
        elif event == "exec_failed":
            # The process went on: its end, if any, comes later.
            process.exec_argv = None
            process.ended = process.end_how = None
            process.snapshot = None
            execs = [(p, when) for p, when in execs if p is not process]
    # A status belongs to the latest process of that pid started before it was reaped.
    for record in reaped:
        pid, when = _int(record.get("pid")), _float(record.get("time"))
        candidates = [p for p in processes if p.pid == pid and p.started <= when]
        if candidates:
            process = candidates[-1]
            code, sig = record.get("code"), record.get("signal")
            process.code = code if isinstance(code, int) else None
            process.signal = sig if isinstance(sig, str) else None
    untraced = []
    for child, argv, parent, when in spawned:
        if not any(p.pid == child and p.started >= when - 1.0 for p in processes):
            untraced.append((child, argv, parent))
    for process, when in execs:
        if not any(p.pid == process.pid and p.started >= when for p in processes):
            untraced.append((process.pid, process.exec_argv or [], process.ppid))
    processes.sort(key=lambda p: p.started)
    return Capture(directory, processes, untraced, problems)


def parents(processes) -> list[int | None]:
    """For each of *processes* (in start order, as :attr:`Capture.processes`), the index of
    its parent among them: the latest process of its parent's pid that started before it;
    ``None`` for a process whose parent was not traced (the root)."""
    found: list[int | None] = []
    for i, process in enumerate(processes):
        parent = None
        for j in range(i - 1, -1, -1):
            if processes[j].pid == process.ppid and processes[j].started <= process.started:
                parent = j
                break
        found.append(parent)
    return found


def _command_and_name(process):
    return (process.argv, process.name)


def _name(process):
    """A :mod:`multiprocessing` name: a role whatever the command line (a forked worker has
    its parent's)."""
    return process.name if process.name and process.name != "MainProcess" else None


def match_processes(old, new) -> list[tuple[int | None, int | None]]:
    """Pair the processes of two captures (lists as :attr:`Capture.processes`) that play
    the same role, whatever their pids: ``(old index, new index)``, ``None`` on the side of a
    process that has no counterpart.

    The rule, from the top of the two trees down: the processes whose parents were not traced
    (the programs run) are matched among themselves, then the children of each matched pair.
    Among the children of two matched processes, those with the same command line and
    :mod:`multiprocessing` name are matched first, the first of one side with the first of
    the other in the order they started; then those with the same multiprocessing name (a
    forked worker has its parent's command line, which may differ between the runs by an
    argument); then the children left, in the order they started. The rest, and all below
    them, are of one side only.
    """

    def children(processes):
        kids: dict[int | None, list[int]] = {}
        for i, parent in enumerate(parents(processes)):
            kids.setdefault(parent, []).append(i)
        return kids

    def below(kids, i):
        found, stack = [], list(kids.get(i, []))
        while stack:
            k = stack.pop()
            found.append(k)
            stack.extend(kids.get(k, []))
        return found

    old_kids, new_kids = children(old), children(new)
    pairs: list[tuple[int | None, int | None]] = []
    queue: list[tuple[int | None, int | None]] = [(None, None)]
    while queue:
        a, b = queue.pop(0)
        left, right = list(old_kids.get(a, [])), list(new_kids.get(b, []))
        found = []
        for role in (_command_and_name, _name):
            for i in list(left):
                key = role(old[i])
                j = next((j for j in right if key is not None and role(new[j]) == key), None)
                if j is not None:
                    found.append((i, j))
                    left.remove(i)
                    right.remove(j)
        found.extend(zip(left, right))
        found.sort(key=lambda pair: pair[0])
        pairs.extend(found)
        queue.extend(found)
        n = min(len(left), len(right))
        for i in left[n:]:
            pairs.extend((k, None) for k in (i, *below(old_kids, i)))
        for j in right[n:]:
            pairs.extend((None, k) for k in (j, *below(new_kids, j)))
    return pairs


def looks_like_python(argv: list[str]) -> bool:
    """Whether a command line runs a Python interpreter, by its program's name."""
    program = os.path.basename(argv[0]) if argv else ""
    return program.startswith("python") or program == os.path.basename(sys.executable)


def untraced_reason(argv: list[str]) -> str:
    """Why a child in :attr:`Capture.untraced` was not traced, as far as its command tells."""
    if looks_like_python(argv):
        return (
            f"{argv[0]} did not start alloctrace: it cannot import alloctrace (install it "
            "there) or runs with -S, -E or -I"
        )
    return "not a Python program"


# ---------------------------------------------------------------------- merging snapshots


def check_compatible(snapshots, names=None) -> None:
    """Refuse to sum snapshots that do not measure the same thing, with a message that says
    which two differ and how."""
    if not snapshots:
        raise ValueError("no snapshots to merge")
    names = list(names) if names is not None else [f"snapshot {i}" for i in range(len(snapshots))]
    first, first_name = snapshots[0], names[0]
    for snapshot, name in zip(snapshots[1:], names[1:]):
        if snapshot.traceback_limit != first.traceback_limit:
            raise ValueError(
                f"cannot merge {first_name} (traceback_limit={first.traceback_limit}) with "
                f"{name} (traceback_limit={snapshot.traceback_limit}): their tracebacks are "
                "cut at different depths, so the same site would be counted under different "
                "keys"
            )
        if snapshot.sample_interval != first.sample_interval:

            def kind(s):
                interval = s.sample_interval
                return "exact" if interval is None else f"sampled at {interval} bytes"

            raise ValueError(
                f"cannot merge {first_name} ({kind(first)}) with {name} ({kind(snapshot)}): "
                "sums of exact figures and estimates, or of estimates at different intervals, "
                "have no single meaning"
            )
        if bool(getattr(snapshot, "is_peak", False)) != bool(getattr(first, "is_peak", False)):
            raise ValueError(
                f"cannot merge {first_name} with {name}: one is a peak snapshot and the other "
                "is not"
            )


def merge_snapshots(snapshots):
    """One :class:`alloctrace.Snapshot` holding the traces of all *snapshots*, e.g. those of
    the processes of a capture: its statistics sum sizes and counts per site across them.

    The snapshots must share their ``traceback_limit`` and their kind (all exact, or all
    sampled at one interval); anything else raises :exc:`ValueError` saying which differ.
    Peak snapshots (per-traceback totals) cannot be merged this way: use
    :func:`combined_statistics`. The result keeps the function names the snapshots recorded
    (an export of it names frames as an export of one snapshot does; a line that ran in
    different functions in different processes takes the first one's) and the
    :attr:`~alloctrace.Snapshot.machine` they all share, if they record the same one; it has no
    metadata, peak, object kinds or retention reports, which belong to one process.
    """
    from alloctrace._snapshot import Snapshot, SnapshotData

    snapshots = list(snapshots)
    for index, snapshot in enumerate(snapshots):
        if not isinstance(snapshot, Snapshot):
            raise TypeError(
                f"snapshots[{index}] must be an alloctrace.Snapshot, not {type(snapshot).__name__}"
            )
    check_compatible(snapshots)
    if any(s.is_peak for s in snapshots):
        raise ValueError(
            "peak snapshots hold per-traceback totals and cannot be merged trace by trace; "
            "use combined_statistics() on them"
        )
    first = snapshots[0]
    data = SnapshotData.merge(
        [s._data for s in snapshots], first.traceback_limit, first.sample_interval
    )
    return Snapshot._from_data(data)


def _stat_key(stat):
    return (stat.traceback, stat.kind)


def combined_statistics(snapshots, key_type, cumulative=False):
    """Statistics of several snapshots summed per site: a list of ``(Statistic, N)``, biggest
    first, N being the number of snapshots the site appears in.

    Works for peak snapshots too (the sum of each process's peak at a site is an upper bound
    of what the site ever held at once across processes). The snapshots must be compatible
    as for :func:`merge_snapshots`.
    """
    from alloctrace._snapshot import Statistic

    snapshots = list(snapshots)
    check_compatible(snapshots)
    sums: dict = {}
    for snapshot in snapshots:
        for stat in snapshot.statistics(key_type, cumulative=cumulative):
            key = _stat_key(stat)
            entry = sums.get(key)
            if entry is None:
                sums[key] = [stat.size, stat.count, 1, stat]
            else:
                entry[0] += stat.size
                entry[1] += stat.count
                entry[2] += 1
    rows = [
        (Statistic(first.traceback, size, count, first.kind), n)
        for size, count, n, first in sums.values()
    ]
    rows.sort(key=lambda row: row[0]._sort_key(), reverse=True)
    return rows


def combined_diff(new_snapshots, old_snapshots, key_type, cumulative=False):
    """Differences between two sets of snapshots, each summed per site as by
    :func:`combined_statistics`: a list of :class:`StatisticDiff`, biggest change first."""
    from alloctrace._snapshot import StatisticDiff

    check_compatible([*old_snapshots, *new_snapshots])
    new = {_stat_key(s): s for s, _ in combined_statistics(new_snapshots, key_type, cumulative)}
    old = {_stat_key(s): s for s, _ in combined_statistics(old_snapshots, key_type, cumulative)}
    diffs = []
    for key, stat in new.items():
        before = old.get(key)
        size0, count0 = (before.size, before.count) if before is not None else (0, 0)
        diffs.append(
            StatisticDiff(
                stat.traceback,
                stat.size,
                stat.size - size0,
                stat.count,
                stat.count - count0,
                stat.kind,
            )
        )
    for key, stat in old.items():
        if key not in new:
            diffs.append(StatisticDiff(stat.traceback, 0, -stat.size, 0, -stat.count, stat.kind))
    diffs.sort(key=lambda d: d._sort_key(), reverse=True)
    return diffs
