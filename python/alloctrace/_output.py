"""Where the Python side writes its files (HTML reports, pytest baselines), by the rules the
native writer follows for snapshots and exports (``src/analysis/format/file.rs``).

* A new file is created with mode ``0600`` (less the umask), or what ``ALLOCTRACE_FILE_MODE``
  says (octal, such as ``0644``): a report holds file paths and source lines, a snapshot's
  retention paths the reprs of dict keys.
* It is written to a temporary file in the same directory and renamed over the name, so a
  failure leaves the previous file in place.
* ``-``, ``/dev/stdout``, ``/dev/fd/1`` and ``/proc/self/fd/1`` write to standard output.
  Any other special file (a device, a FIFO, a socket, or a link to one) is refused with
  :exc:`OutputError`: it is never replaced by a regular file.
* A symbolic link owned by the writer (or by root) is followed, and the file it leads to is
  replaced; a link owned by anyone else is not followed but replaced itself, since in a
  shared sticky directory another user may have planted it where the next output goes.
"""

from __future__ import annotations

import os
import stat
import sys

MODE_VARIABLE = "ALLOCTRACE_FILE_MODE"
DEFAULT_MODE = 0o600
STDOUT_NAMES = ("-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")


class OutputError(ValueError):
    """An output name that cannot be written as asked (a special file, a bad mode)."""


def file_mode(text: str | None = None) -> int:
    """``ALLOCTRACE_FILE_MODE`` (or *text*) as permission bits, or :data:`DEFAULT_MODE`."""
    if text is None:
        text = os.environ.get(MODE_VARIABLE)
    if text is None:
        return DEFAULT_MODE
    digits = text.strip()
    digits = digits[2:] if digits.startswith("0o") else digits
    try:
        mode = int(digits, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise OutputError(
            f"{MODE_VARIABLE}={text!r}: expected permission bits in octal, like 0600 or 0644"
        )
    return mode


def is_stdout(path: str) -> bool:
    """Whether *path* names standard output: ``-``, ``/dev/stdout`` and its aliases, or any
    link to the pipe or terminal that standard output is."""
    if path == "-" or os.path.abspath(path) in STDOUT_NAMES[1:]:
        return True
    try:
        named, out = os.stat(path), os.fstat(1)
    except (OSError, ValueError):
        return False
    same = (named.st_dev, named.st_ino) == (out.st_dev, out.st_ino)
    return same and not stat.S_ISREG(named.st_mode)


def _kind(mode: int) -> str:
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a special file"


def destination(path: str) -> str:
    """The name the new file is renamed onto: *path*, or the file a trusted link leads to.

    :exc:`OutputError` for a special file or a trusted link to one."""
    try:
        link = os.lstat(path)
    except FileNotFoundError:
        return path
    if stat.S_ISLNK(link.st_mode):
        if link.st_uid not in (os.geteuid(), 0):
            return path  # planted by someone else: replaced, never followed
        try:
            target = os.stat(path)
        except FileNotFoundError:
            return path  # dangling: replaced, as the native writer does
        if not stat.S_ISREG(target.st_mode):
            raise OutputError(
                f"{path} leads to {_kind(target.st_mode)}, not a regular file (write to "
                "'-' for standard output)"
            )
        return os.path.realpath(path)
    if not stat.S_ISREG(link.st_mode):
        raise OutputError(
            f"{path} is {_kind(link.st_mode)}, not a regular file (write to '-' for "
            "standard output)"
        )
    return path


def check(path: str) -> None:
    """Raise :exc:`OutputError` now for what :func:`write` would refuse later."""
    file_mode()
    if not is_stdout(path):
        destination(path)


def write(path: str, data: bytes) -> None:
    """Write *data* to *path* by the rules of this module."""
    mode = file_mode()
    if is_stdout(path):
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    import tempfile

    target = destination(path)
    directory = os.path.dirname(os.path.abspath(target))
    handle, temporary = tempfile.mkstemp(
        prefix="." + os.path.basename(target)[:200] + ".", suffix=".tmp", dir=directory
    )
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(handle, mode & ~umask)
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
