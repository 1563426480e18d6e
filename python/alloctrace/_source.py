"""Source lines for the command line's listings and HTML reports, read only where that is safe.

A snapshot names the files its frames were in, and a snapshot may come from anyone: the file
names are untrusted input that decides which files of the reader's machine are opened. So a
line is shown only from a file that is

* a regular file once opened (``fstat``): never a device, a FIFO or a socket, and nothing under
  ``/proc``, ``/sys`` or ``/dev`` (where regular-looking files hold a process's environment);
* Python source: its name ends in ``.py``, ``.pyw``, ``.pyi``, ``.pyx``, ``.pxd`` or ``.pxi``,
  or its first line is a ``#!`` line naming python (console scripts), and it holds no NUL;
* opened without blocking (``O_NONBLOCK``, ``O_NOCTTY``), its final component opened as
  resolved (``O_NOFOLLOW``), and read to at most :data:`MAX_BYTES` bytes;
* when ``ALLOCTRACE_SOURCE_PATH`` is set (directories separated by ``:``) or a command is given
  ``--source-from DIR``, inside one of those directories once every link is resolved.

And a line is shown only for a snapshot taken on this machine. A file name in a snapshot from
another machine names a file of *that* machine: the reader's file of the same name is another
version, or another file altogether, and its lines would be a wrong answer (and the reader's own
source would leak into a report they pass on). Snapshots record the machine they were taken on
(:attr:`alloctrace.Snapshot.machine`: an application-specific hash of ``/etc/machine-id``, never
the raw id, or where a container image has none, of the boot id and the hostname, which changes
at each reboot; and the hostname for display). The commands show source lines when every snapshot
they loaded was taken here, or when the user consents for the others by naming where their
source is: ``--source-from DIR`` or an explicitly set ``ALLOCTRACE_SOURCE_PATH`` (then the lines
come from those directories only). Snapshots that record no machine (written before alloctrace
recorded it, built by hand, ``tracemalloc`` pickles) count as from elsewhere: without consent
they are shown without source lines, and the command says so once on stderr. A merge of
snapshots of one machine keeps that machine. The machine id is a fidelity guard, not an
authentication: a file can claim any id, and the rules above still apply to what it names.

Whatever fails a rule is shown without its source line, as a file that no longer exists is.
``tracemalloc``'s own API (``Traceback.format()``) keeps reading through :mod:`linecache`, as
the standard module does; this rule is for what the ``alloctrace`` commands print and write.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import sys
import tokenize

#: At most this much of one file is read: the lines past it are shown without source.
MAX_BYTES = 4 << 20
#: The cache is emptied when the files it holds exceed this many bytes.
CACHE_BYTES = 64 << 20
SUFFIXES = (".py", ".pyw", ".pyi", ".pyx", ".pxd", ".pxi")
#: Kernel file systems: their "regular" files are a process's environment, memory, keys.
REFUSED_ROOTS = ("/proc", "/sys", "/dev")
ENVIRONMENT = "ALLOCTRACE_SOURCE_PATH"

_cache: dict[str, list[str] | None] = {}
_cached_bytes = 0
#: Directories given with ``--source-from`` in the current command.
_source_from: list[str] = []
#: Whether a snapshot from elsewhere was loaded without consent in the current command: then
#: no source line is shown at all (a listing may mix the snapshots' frames). The message that
#: says so, until it was said (on the first line asked for: a command that fails first, or
#: shows no source, says nothing); then True.
_withheld: str | bool = False
#: Whether the current command shows no source anyway (``--no-source``): nothing to say.
_quiet = False


def _under(path: str, roots) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def allowed_roots() -> list[str] | None:
    """The directories of ``ALLOCTRACE_SOURCE_PATH`` and ``--source-from`` (links resolved), or
    ``None`` if neither is given."""
    value = os.environ.get(ENVIRONMENT)
    if value is None and not _source_from:
        return None
    parts = (value.split(os.pathsep) if value is not None else []) + _source_from
    return [os.path.realpath(part) for part in parts if part]


def this_machine() -> tuple[str, str] | None:
    """``(id, hostname)`` as snapshots taken on this machine record it, or ``None``."""
    from ._native import SnapshotData

    return SnapshotData.this_machine()


def from_this_machine(snapshot) -> bool:
    """Whether *snapshot* says it was taken on this machine (by id; the hostname is for
    display only)."""
    machine = getattr(snapshot, "machine", None)
    here = this_machine()
    return machine is not None and here is not None and machine[0] == here[0]


def consented() -> bool:
    """Whether the user named where source lines may come from for snapshots of elsewhere."""
    return ENVIRONMENT in os.environ or bool(_source_from)


@contextlib.contextmanager
def scope(source_from=(), quiet=False):
    """One command's decisions: the ``--source-from`` directories it was given, and whether it
    loaded a snapshot from elsewhere (said on stderr unless *quiet*, as under ``--no-source``).
    Restored on exit (commands may run in one process)."""
    global _source_from, _withheld, _quiet, _cached_bytes
    saved = (_source_from, _withheld, _quiet)
    _source_from = list(saved[0]) + [os.fspath(d) for d in source_from or ()]
    _withheld = False
    _quiet = quiet or saved[2]
    # What may be read depends on the directories: nothing read under others is reused.
    _cache.clear()
    _cached_bytes = 0
    try:
        yield
    finally:
        _source_from, _withheld, _quiet = saved
        _cache.clear()
        _cached_bytes = 0


def note_origin(snapshot, path: str = "") -> None:
    """Record a snapshot the current command shows: one from another machine (or from nowhere
    known) turns source lines off, unless the user consented (see the module's docstring).
    The first line then asked for says so on stderr, once."""
    global _withheld
    if _withheld or consented() or from_this_machine(snapshot):
        return
    machine = getattr(snapshot, "machine", None)
    where = (
        f"was taken on another machine ({machine[1] or 'no hostname'})"
        if machine is not None
        else "does not say which machine it was taken on"
    )
    name = f"{path} " if path else "a snapshot "
    _withheld = (
        f"alloctrace: source lines not shown: {name}{where}; "
        "--source-from DIR reads them from DIR\n"
    )


def _is_python(name: str, data: bytes) -> bool:
    if name.endswith(SUFFIXES):
        return True
    first = data.split(b"\n", 1)[0]
    return first.startswith(b"#!") and b"python" in first


def _read(filename: str) -> list[str] | None:
    """The lines of *filename* if the rules of this module let it be read, else ``None``."""
    if not filename or "\0" in filename or filename.startswith("<"):
        return None
    try:
        real = os.path.realpath(filename)
    except (OSError, ValueError):
        return None
    if _under(real, REFUSED_ROOTS):
        return None
    roots = allowed_roots()
    if roots is not None and not _under(real, roots):
        return None
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(real, flags)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        left = MAX_BYTES
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if b"\0" in data or not _is_python(real, data):
        return None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding, errors="replace")
    except (SyntaxError, LookupError):
        text = data.decode("utf-8", errors="replace")
    # Lines as the compiler counts them: only \n, \r\n and \r end one.
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def line(filename: str, lineno: int) -> str:
    """Line *lineno* of *filename*, stripped, or ``""`` where it may not or cannot be read."""
    global _cached_bytes, _withheld
    if _withheld:
        if isinstance(_withheld, str) and not _quiet:
            sys.stderr.write(_withheld)
        _withheld = True
        return ""
    if lineno <= 0:
        return ""
    if filename in _cache:
        lines = _cache[filename]
    else:
        lines = _read(filename)
        size = sum(len(text) for text in lines) if lines else 0
        if _cached_bytes + size > CACHE_BYTES:
            _cache.clear()
            _cached_bytes = 0
        _cache[filename] = lines
        _cached_bytes += size
    if not lines or lineno > len(lines):
        return ""
    return lines[lineno - 1].strip()
