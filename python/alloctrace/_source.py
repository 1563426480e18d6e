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
* when ``ALLOCTRACE_SOURCE_PATH`` is set (directories separated by ``:``), inside one of those
  directories once every link is resolved.

Whatever fails a rule is shown without its source line, as a file that no longer exists is.
``tracemalloc``'s own API (``Traceback.format()``) keeps reading through :mod:`linecache`, as
the standard module does; this rule is for what the ``alloctrace`` commands print and write.
"""

from __future__ import annotations

import io
import os
import stat
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


def _under(path: str, roots) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def allowed_roots() -> list[str] | None:
    """The directories of ``ALLOCTRACE_SOURCE_PATH`` (links resolved), or ``None`` if unset."""
    value = os.environ.get(ENVIRONMENT)
    if value is None:
        return None
    return [os.path.realpath(part) for part in value.split(os.pathsep) if part]


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
    global _cached_bytes
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
