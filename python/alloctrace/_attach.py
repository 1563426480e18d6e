"""``alloctrace attach PID`` and ``alloctrace detach PID``: start and stop tracing inside a
running CPython process that was started without alloctrace.

The command never runs Python code in the target itself. A *method* (a debugger today; 3.14's
``sys.remote_exec`` fits the same slot) only gets a few lines of bootstrap code scheduled in
the target: with lldb, the process is stopped, one page is mapped with the ``mmap`` system call
(no lock), the bootstrap is written into it, ``Py_AddPendingCall(PyRun_SimpleString, page)``
queues it (a fixed-size queue, no allocation, callable from any thread), and the debugger
detaches at once. Nothing runs while a thread might be inside ``malloc`` or hold a lock: the
interpreter runs the bootstrap itself, in the main thread with the GIL, at its next check
between two bytecodes (see :mod:`alloctrace._attach_target` for what it does there).

The command and the target talk through a private directory: the request (options) goes in,
the target renames it when it takes it and writes one status file back. If the target does not
take the request within the timeout (its main thread is blocked in a long C call), the command
renames the request away, so that the bootstrap does nothing when it runs at last, and reports
it. Every failure is one line (:class:`AttachError`) and leaves the target running.
"""

from __future__ import annotations

import abc
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from . import _attach_target as _target
from . import _debugger_pages

#: Interpreters whose pending-call queue and bootstrap alloctrace knows.
SUPPORTED = ((3, 9), (3, 10), (3, 11), (3, 12), (3, 13))

#: Default wait for the target's main thread to reach a safe point, in seconds.
DEFAULT_TIMEOUT = 30.0

#: How long one debugger run may take before it is stopped, in seconds.
DEBUGGER_TIMEOUT = 60.0

REQUEST = "request.json"


class AttachError(Exception):
    """The attach or detach failed; the message says why, in one line."""


class Target:
    """What is known of the process before any debugger touches it."""

    def __init__(self, pid: int):
        self.pid = pid
        self.state = _state(pid)
        if self.state in ("Z", "X"):
            raise AttachError(f"process {pid} has exited (it is a zombie)")
        self.uid = _owner(pid)
        self.version = _cpython_version(pid)
        # Paths as the command sees them: through /proc/PID/root when the target lives in
        # another mount namespace (a container seen from the host).
        self.root = "" if _same_mount_namespace(pid) else f"/proc/{pid}/root"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stream:
            stat = stream.read()
    except FileNotFoundError:
        raise AttachError(f"no process {pid}") from None
    return stat[stat.rindex(b")") + 2 :].split()[0].decode()


def _owner(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as stream:
            status = stream.read()
    except FileNotFoundError:
        raise AttachError(f"no process {pid}") from None
    uid = int(re.search(r"^Uid:\s+\d+\s+(\d+)", status, re.M).group(1))
    if os.geteuid() != 0 and uid != os.geteuid():
        import pwd

        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = f"uid {uid}"
        raise AttachError(
            f"process {pid} belongs to another user ({name}): run the command as that user, "
            "or as root"
        )
    return uid


def _same_mount_namespace(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/mnt").st_ino == os.stat("/proc/self/ns/mnt").st_ino
    except OSError:
        return True


def _cpython_version(pid: int) -> tuple[int, int]:
    """The target's CPython version, from its libpython or, statically linked, its executable.

    Refuses a process that is not CPython before a debugger is started: its executable or a
    mapped libpython must export the two functions the bootstrap needs.
    """
    try:
        with open(f"/proc/{pid}/maps") as stream:
            maps = stream.read()
        exe = os.readlink(f"/proc/{pid}/exe")
    except FileNotFoundError:
        raise AttachError(f"no process {pid}") from None
    except PermissionError:
        raise AttachError(
            _ptrace_refused(pid, f"cannot read /proc/{pid}/maps: permission denied")
        ) from None
    found = re.search(r"\S*/libpython(\d+)\.(\d+)[^/\s]*\.so[^/\s]*$", maps, re.M)
    if found:
        version = (int(found.group(1)), int(found.group(2)))
    else:
        image = f"/proc/{pid}/exe"
        if not _exports_python(image):
            name = os.path.basename(exe)
            raise AttachError(f"process {pid} ({name}) is not a CPython interpreter")
        version = _run_version(image, pid)
    if version not in SUPPORTED:
        raise AttachError(
            f"process {pid} runs Python {version[0]}.{version[1]}: alloctrace attaches to "
            "CPython 3.9 to 3.13"
        )
    return version


def _exports_python(path: str) -> bool:
    needed = {b"Py_AddPendingCall\0", b"PyRun_SimpleString\0"}
    tail = b""
    try:
        with open(path, "rb") as stream:
            while needed:
                chunk = stream.read(1 << 20)
                if not chunk:
                    break
                data = tail + chunk
                needed = {name for name in needed if name not in data}
                tail = data[-32:]
    except OSError:
        return False
    return not needed


def _run_version(image: str, pid: int) -> tuple[int, int]:
    """The version of a statically linked interpreter, asked of its executable (isolated:
    no site, no environment)."""
    try:
        out = subprocess.run(
            [image, "-I", "-S", "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.split()
        return int(out[0]), int(out[1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        raise AttachError(
            f"process {pid}: cannot tell which Python version its executable is"
        ) from None


class Method(abc.ABC):
    """One way to run the bootstrap inside the target. A method says whether it can serve
    this target (:meth:`unavailable`) and schedules the bootstrap (:meth:`schedule`); the
    commands do not change when a method is added (3.14's ``sys.remote_exec`` would be one
    that writes the bootstrap to a file and passes its path)."""

    name = ""

    @abc.abstractmethod
    def unavailable(self, target: Target) -> str | None:
        """Why this method cannot serve *target*, or ``None`` if it can."""

    @abc.abstractmethod
    def schedule(self, target: Target, bootstrap: str, directory: str) -> None:
        """Have *bootstrap* run in the target's main thread at its next safe point; return
        once it is queued, with the target running. *directory* is the request directory
        (as this command sees it) for any file the method needs."""


class Lldb(Method):
    """Queue the bootstrap with ``Py_AddPendingCall`` from lldb (see the module's docs)."""

    name = "lldb"

    def unavailable(self, target: Target) -> str | None:
        if shutil.which("lldb") is None:
            return "no lldb found on PATH: install it (Debian and Ubuntu: apt-get install lldb)"
        return None

    def schedule(self, target: Target, bootstrap: str, directory: str) -> None:
        size = (len(bootstrap) + 1 + 4095) // 4096 * 4096
        # The page's size goes into the lines now, its address once it is mapped (below): with
        # both, the lines unmap the page when they run.
        fields = f"{PAGE_ADDRESS_FIELD}, {PAGE_SIZE_FIELD}"
        address_at = bootstrap.index(fields) + 2
        filled = f"{PAGE_ADDRESS_FIELD}, {size:#0{len(PAGE_SIZE_FIELD)}x}"
        bootstrap = bootstrap.replace(fields, filled, 1)
        code = bootstrap.encode() + b"\0"
        page = os.path.join(directory, "bootstrap")
        with open(page, "wb") as stream:
            stream.write(code)
        # lldb's own pages are given back before it detaches (see _debugger_pages).
        pages = [shlex.quote(sys.executable), shlex.quote(_debugger_pages.__file__)]
        maps = shlex.quote(os.path.join(directory, "maps"))
        release = shlex.quote(os.path.join(directory, "release.lldb"))
        shell = "platform shell -h -t 20 -- "
        commands = [
            f"process attach --pid {target.pid}",
            shell + " ".join([*pages, "save", str(target.pid), maps]),
            # mmap(NULL, size, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0) as a
            # raw system call (9), safe wherever the threads were stopped. Not through the
            # name "mmap": Rust's standard library, loaded with alloctrace, has a function of
            # that name too, which makes lldb's lookup ambiguous.
            "expr -- void *$alloctrace_page = (void *)((long (*)(long, ...))syscall)(9L, 0L, "
            f"{size}L, 3L, 34L, -1L, 0L)",
            "expr -- (unsigned long)$alloctrace_page",
            f"memory write -i {page} $alloctrace_page",
            "expr -- void *$alloctrace_run = (void *)(int (*)(const char *))PyRun_SimpleString",
            # Other threads are let run if the queue's lock is held by one of them.
            "expr -a true -t 5000000 -- (int)((int (*)(void *, void *))Py_AddPendingCall)"
            "($alloctrace_run, $alloctrace_page)",
            # The page's address, into the hex digits of PAGE_ADDRESS_FIELD. After queueing, so
            # that if this failed the attach would not; the target is stopped until the detach.
            f"expr -- char *alloctrace_at = (char *)$alloctrace_page + {address_at}; "
            "unsigned long alloctrace_v = (unsigned long)$alloctrace_page; "
            "for (int alloctrace_i = 15; alloctrace_i >= 0; alloctrace_i--) { "
            'alloctrace_at[alloctrace_i] = "0123456789abcdef"[alloctrace_v & 15]; '
            "alloctrace_v >>= 4; } (int)0",
            shell + " ".join([*pages, "release", str(target.pid), maps, release]),
            f"command source -s true {release}",
            "process detach",
        ]
        argv = ["lldb", "--batch", "--no-lldbinit"]
        for command in commands:
            argv += ["-o", command]
        was_stopped = target.state in ("T", "t")
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                start_new_session=True,
            )
        except OSError as exc:
            raise AttachError(f"cannot run lldb: {exc.strerror or exc}") from None
        try:
            out, _ = proc.communicate(timeout=DEBUGGER_TIMEOUT)
        except subprocess.TimeoutExpired:
            # The session we started: lldb and its lldb-server. Their end detaches the target.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            out = None
        finally:
            _resume(target.pid, was_stopped)
        if out is None:
            raise AttachError(
                f"lldb did not finish within {DEBUGGER_TIMEOUT:g} s; it was stopped and "
                f"process {target.pid} left running"
            )
        self._check(target, out)

    @staticmethod
    def _check(target: Target, out: str) -> None:
        pid = target.pid
        queued = re.search(
            r"Py_AddPendingCall\)\(\$alloctrace_run, \$alloctrace_page\)\n\(int\) \$\d+ = (-?\d+)",
            out,
        )
        if queued and queued.group(1) == "0":
            # Queued. lldb detaches on its way out even if its detach command failed, and
            # _resume has made sure the process runs.
            return
        if queued:
            raise AttachError(
                f"process {pid}: the interpreter's queue of pending calls is full; try again"
            )
        errors = [line[7:] for line in out.splitlines() if line.startswith("error: ")]
        text = " ".join(errors) or out.strip()[-300:]
        if _gone(pid):
            raise AttachError(f"process {pid} exited during the attach")
        if "attach failed" in text or "Operation not permitted" in text:
            raise AttachError(_ptrace_refused(pid, text))
        raise AttachError(f"lldb could not queue the bootstrap in process {pid}: {text}")


def _gone(pid: int) -> bool:
    """Whether *pid* has ended (a zombie has too)."""
    try:
        return _state(pid) in ("Z", "X")
    except AttachError:
        return True


def _ptrace_refused(pid: int, detail: str) -> str:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as stream:
            scope = stream.read().strip()
    except OSError:
        scope = None
    why = f"not allowed to trace process {pid} ({detail.strip()})"
    if scope not in (None, "0"):
        return (
            f"{why}: /proc/sys/kernel/yama/ptrace_scope is {scope}; run as root (with "
            "CAP_SYS_PTRACE), or set it to 0 (sysctl kernel.yama.ptrace_scope=0)"
        )
    return (
        f"{why}: the command needs CAP_SYS_PTRACE over it (root, or the same user with "
        "/proc/sys/kernel/yama/ptrace_scope 0); in a container, run it with "
        "--cap-add=SYS_PTRACE"
    )


def _resume(pid: int, was_stopped: bool) -> None:
    """Never leave the target stopped: a debugger that died may leave its SIGSTOP behind."""
    if was_stopped:
        return
    for _ in range(20):
        try:
            state = _state(pid)
        except AttachError:
            return
        if state not in ("T", "t"):
            return
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            return
        time.sleep(0.05)


#: In the order they are tried; the first that can serve the target is used.
METHODS: tuple[Method, ...] = (Lldb(),)


def choose_method(target: Target) -> Method:
    reasons = []
    for method in METHODS:
        why = method.unavailable(target)
        if why is None:
            return method
        reasons.append(why)
    raise AttachError("; ".join(reasons))


#: The bootstrap lines start with this; the page they were queued from is unmapped only if
#: it starts with it too.
BOOTSTRAP_PREFIX = "__import__('builtins').exec("

#: Fields of the bootstrap lines a method fills in, at the same width, when it knows the page
#: the lines run from: its address (16 hex digits) and size. Left at zero, nothing is unmapped.
PAGE_ADDRESS_FIELD = "0x0000000000000000"
PAGE_SIZE_FIELD = "0x00000000"


def _bootstrap(directory: str) -> str:
    """The lines the target runs: claim the request, import alloctrace from its own
    sys.path, hand over, then unmap the page the lines were queued from (CPython compiled
    them before running them). They run in a namespace of their own, never in ``__main__``'s,
    and let no exception out (it would surface in the program's code)."""
    body = f"""\
import os, sys
d = {directory!r}
try:
    os.rename(os.path.join(d, {REQUEST!r}), os.path.join(d, {_target.CLAIMED!r}))
except BaseException:
    pass
else:
    try:
        try:
            from alloctrace import _attach_target
        except BaseException as e:
            import json
            with open(os.path.join(d, ".status.json"), "w") as f:
                json.dump({{"ok": False, "import_error": "%s: %s" % (type(e).__name__, e),
                    "executable": sys.executable, "prefix": sys.prefix}}, f)
            os.replace(os.path.join(d, ".status.json"), os.path.join(d, "status.json"))
        else:
            _attach_target.handle(d)
            if __page__[0]:
                from alloctrace import _native
                _native._release_bootstrap_page(*__page__, {BOOTSTRAP_PREFIX.encode()!r})
    except BaseException:
        pass
"""
    page = f"({PAGE_ADDRESS_FIELD}, {PAGE_SIZE_FIELD})"
    namespace = f"{{'__name__': '__alloctrace_attach__', '__page__': {page}}}"
    return f"{BOOTSTRAP_PREFIX}{body!r}, {namespace})"


def request(pid: int, action: str, options: dict, timeout: float) -> dict:
    """Have process *pid* carry out *action* (``start`` or ``stop``); return its status.

    Raise :class:`AttachError` with a one-line reason on any failure.
    """
    if pid == os.getpid():
        raise AttachError("cannot attach to the alloctrace command itself")
    if pid <= 0:
        raise AttachError(f"no process {pid}")
    target = Target(pid)
    method = choose_method(target)
    visible = tempfile.mkdtemp(prefix="alloctrace-attach-", dir=target.root + "/tmp")
    try:
        if target.uid != os.geteuid():
            os.chown(visible, target.uid, -1)
        inside = visible[len(target.root) :]
        document = {"protocol": _target.PROTOCOL, "action": action, **options}
        with open(os.path.join(visible, REQUEST), "w") as stream:
            json.dump(document, stream)
        if target.uid != os.geteuid():
            os.chown(os.path.join(visible, REQUEST), target.uid, -1)
        method.schedule(target, _bootstrap(inside), visible)
        status = _wait(pid, visible, _target.STATUS, timeout, cancel=True)
        if status is None:
            raise AttachError(
                f"process {pid} did not reach a point where Python code can run within "
                f"{timeout:g} s (its main thread is in a long call outside Python, e.g. a "
                "sleep, a lock or I/O); nothing was changed: try again, or with a longer "
                "--timeout"
            )
        _raise_for(pid, status)
        if options.get("duration") is not None:
            finished = _wait(pid, visible, _target.FINISHED, options["duration"] + timeout)
            if finished is None:
                raise AttachError(
                    f"process {pid} wrote no snapshot within {options['duration'] + timeout:g} s"
                )
            _raise_for(pid, finished)
            status.update(finished)
        return status
    finally:
        shutil.rmtree(visible, ignore_errors=True)


def _raise_for(pid: int, status: dict) -> None:
    if status.get("ok"):
        return
    if "import_error" in status:
        exe = status.get("executable") or "its interpreter"
        raise AttachError(
            f"alloctrace cannot be imported in process {pid} ({status['import_error']}): "
            f"install it for that interpreter, {exe} (sys.prefix {status.get('prefix')}), "
            f"e.g. {exe} -m pip install alloctrace"
        )
    raise AttachError(f"process {pid}: {status.get('error')}")


def _wait(pid: int, directory: str, name: str, timeout: float, cancel: bool = False):
    path = os.path.join(directory, name)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as stream:
                return json.load(stream)
        except FileNotFoundError:
            pass
        if _gone(pid):
            raise AttachError(f"process {pid} exited during the attach")
        if time.monotonic() >= deadline:
            if not cancel:
                return None
            try:
                os.rename(os.path.join(directory, REQUEST), os.path.join(directory, "cancelled"))
                return None
            except FileNotFoundError:
                # Taken just now: the status follows.
                deadline = time.monotonic() + 10
                cancel = False
        time.sleep(0.02)
