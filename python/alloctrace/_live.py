"""The live view: ``alloctrace top --interval SECONDS FILE_PATTERN`` and
``alloctrace top --pid PID --interval SECONDS``.

With ``--pid`` the view asks the process itself for a snapshot at each interval (as
``alloctrace snapshot PID`` does, see :mod:`alloctrace._ondemand`) instead of waiting for files.

A process started with ``ALLOCTRACE_DUMP`` and ``ALLOCTRACE_INTERVAL`` keeps writing numbered
snapshots; this view looks every SECONDS for the newest file matching the pattern (by
modification time), and when a new one has arrived redraws the screen with its top lines and
their growth since the dump before it, until interrupted (Ctrl-C). Dumps are renamed into
place whole (their temporary names start with a dot, which a ``*`` does not match), so a file
that matches is complete; one that still cannot be read is reported on the status line and
tried again at the next look.

Given a process-tree capture directory instead of a pattern (see :mod:`alloctrace._capture`),
the view follows every process of the tree at once: :func:`run_capture`.
"""

from __future__ import annotations

import glob
import os
import shutil
import time
from typing import Any, Callable

from . import _report

#: Clear the screen and put the cursor at the top left.
CLEAR = "\x1b[H\x1b[2J"


def _series(pattern: str) -> list[str]:
    """Matching files, oldest first."""
    found = []
    for path in glob.glob(pattern):
        try:
            found.append((os.stat(path).st_mtime_ns, path))
        except OSError:
            pass
    found.sort()
    return [path for _, path in found]


def render(
    newest: tuple[str, Any],
    previous: tuple[str, Any] | None,
    limit: int | None,
    width: int | None,
    source: bool = True,
    full_paths: bool = False,
) -> list[str]:
    """The screen: the newest dump's top lines by size, with their growth since *previous*;
    *limit* ``None`` shows every line."""
    path, snapshot = newest
    look = (limit, width, source, full_paths)
    if previous is None:
        return _sizes_screen(
            snapshot.statistics("lineno"),
            look,
            lambda shown: f"Top {_lines(shown)} of {path} (the first dump: no growth yet)",
        )
    old_path, old = previous
    return _growth_screen(
        snapshot.compare_to(old, "lineno"),
        look,
        lambda shown: f"Top {_lines(shown)} of {path}, growth since {old_path}",
    )


def _renderer(shown, look) -> _report.Renderer:
    _, width, source, full_paths = look
    names = [frame.filename for item in shown for frame in item.traceback]
    return _report.Renderer(
        width, _report.PathShortener(names, enabled=not full_paths), source=source
    )


def _sizes_screen(stats, look, title, notes=None) -> list[str]:
    """The first screen: *stats* by size; *look* is ``(limit, width, source, full_paths)``,
    *title* a function of the number of lines shown."""
    limit = look[0]
    shown = stats if limit is None else stats[:limit]
    return _renderer(shown, look).stats(
        stats,
        key_type="lineno",
        cumulative=False,
        limit=limit,
        total_size=sum(stat.size for stat in stats),
        total_count=sum(stat.count for stat in stats),
        title=title(len(shown)),
        notes=notes,
    )


def _growth_screen(diffs, look, title) -> list[str]:
    """A later screen: the top lines by size (what holds the memory now), each with what it
    gained since the previous screen."""
    limit = look[0]
    diffs.sort(key=lambda d: (-d.size, -d.size_diff))
    diffs = [d for d in diffs if d.size or d.size_diff]
    shown = diffs if limit is None else diffs[:limit]
    total = {
        "size": sum(d.size for d in diffs),
        "size_diff": sum(d.size_diff for d in diffs),
        "count": sum(d.count for d in diffs),
        "count_diff": sum(d.count_diff for d in diffs),
    }
    return _renderer(shown, look).diff(
        diffs,
        key_type="lineno",
        cumulative=False,
        limit=limit,
        total=total,
        title=title(len(shown)),
    )


def _lines(count: int) -> str:
    return f"{count} line" if count == 1 else f"{count} lines"


def run(
    pattern: str,
    interval: float,
    stream,
    *,
    limit: int | None = 10,
    source: bool = True,
    full_paths: bool = False,
    load: Callable[[str], Any],
    width: Callable[[], int | None] | None = None,
) -> None:
    """Redraw on *stream* whenever a newer dump matches *pattern*; returns only by an exception
    (KeyboardInterrupt from Ctrl-C). *load* reads a snapshot file or raises ``ValueError`` or
    ``OSError`` with a message naming it."""
    if width is None:

        def width() -> int | None:
            return shutil.get_terminal_size().columns

    shown: tuple[str, int] | None = None
    cache: dict[str, tuple[int, Any]] = {}
    while True:
        series = _series(pattern)
        if not series:
            _draw(stream, [f"alloctrace top: waiting for a file matching {pattern}…"])
        else:
            newest = series[-1]
            try:
                stamp = os.stat(newest).st_mtime_ns
                if shown != (newest, stamp):
                    loaded = []
                    for path in series[-2:]:
                        mtime = os.stat(path).st_mtime_ns
                        if path not in cache or cache[path][0] != mtime:
                            cache[path] = (mtime, load(path))
                        loaded.append((path, cache[path][1]))
                    for stale in set(cache) - set(series[-2:]):
                        del cache[stale]
                    previous = loaded[0] if len(loaded) == 2 else None
                    lines = render(loaded[-1], previous, limit, width(), source, full_paths)
                    clock = time.strftime("%H:%M:%S")
                    lines.append("")
                    lines.append(
                        f"{len(series)} dumps match {pattern}; redrawn at {clock}, "
                        f"looking every {interval:g} s; Ctrl-C to quit"
                    )
                    _draw(stream, lines)
                    shown = (newest, stamp)
            except (OSError, ValueError) as exc:
                _status(stream, f"alloctrace top: {exc}")
        time.sleep(interval)


def run_pid(
    pid: int,
    interval: float,
    stream,
    *,
    request: Callable[[int], str],
    limit: int | None = 10,
    source: bool = True,
    full_paths: bool = False,
    load: Callable[[str], Any],
    width: Callable[[], int | None] | None = None,
) -> None:
    """Ask process *pid* for a snapshot every *interval* seconds (*request* returns the new
    file's path, or raises ``ValueError`` or ``OSError`` saying why not) and redraw with the
    growth since the one before; returns only by an exception (KeyboardInterrupt).

    The files are the process's own series (its dump path); the view keeps the last two it
    asked for and removes older ones it asked for, so that hours of watching do not fill the
    disk.
    """
    if width is None:

        def width() -> int | None:
            return shutil.get_terminal_size().columns

    previous: tuple[str, Any] | None = None
    asked: list[str] = []
    while True:
        try:
            path = request(pid)
            snapshot = load(path)
        except (OSError, ValueError) as exc:
            _status(stream, f"alloctrace top: {exc}")
        else:
            asked.append(path)
            while len(asked) > 2:
                try:
                    os.unlink(asked.pop(0))
                except OSError:
                    pass
            lines = render((path, snapshot), previous, limit, width(), source, full_paths)
            lines.append("")
            lines.append(
                f"process {pid}, asked at {time.strftime('%H:%M:%S')}, every {interval:g} s; "
                "Ctrl-C to quit"
            )
            _draw(stream, lines)
            previous = (path, snapshot)
        time.sleep(interval)


def _capture_now(directory: str):
    """The capture in *directory* as its manifest is now, and the newest snapshot file of
    each process that has written one (its exit snapshot, else its last numbered one)."""
    from . import _capture

    capture = _capture.load_capture(directory)
    newest = []
    for process in capture.processes:
        path = process.last_snapshot
        if path is not None and os.path.isfile(path):
            newest.append(path)
    return capture, newest


def render_capture(
    directory: str,
    snapshots: list,
    previous: list | None,
    limit: int | None,
    width: int | None,
    source: bool = True,
    full_paths: bool = False,
) -> list[str]:
    """The screen of a capture: the top lines summed over the newest snapshot of each of its
    processes, each with the number of processes it is in, and with their growth since the
    *previous* screen's snapshots."""
    from . import _capture

    n = len(snapshots)
    processes = "1 process" if n == 1 else f"{n} processes"
    look = (limit, width, source, full_paths)
    if previous is None:
        rows = _capture.combined_statistics(snapshots, "lineno")
        return _sizes_screen(
            [stat for stat, _ in rows],
            look,
            lambda shown: (
                f"Top {_lines(shown)} summed over {processes} of {directory} "
                "(the first look: no growth yet)"
            ),
            notes=[f", in {k} process{'es' if k > 1 else ''}" for _, k in rows],
        )
    return _growth_screen(
        _capture.combined_diff(snapshots, previous, "lineno"),
        look,
        lambda shown: (
            f"Top {_lines(shown)} summed over {processes} of {directory}, growth "
            "since the previous screen"
        ),
    )


def run_capture(
    directory: str,
    interval: float,
    stream,
    *,
    limit: int | None = 10,
    source: bool = True,
    full_paths: bool = False,
    load: Callable[[str], Any],
    width: Callable[[], int | None] | None = None,
) -> None:
    """As :func:`run`, over a process-tree capture: every SECONDS, read its manifest and,
    when a process has written a newer snapshot (or a new process its first), redraw the top
    lines summed over the newest snapshot of every process (see :func:`render_capture`)."""
    if width is None:

        def width() -> int | None:
            return shutil.get_terminal_size().columns

    shown: tuple | None = None
    previous: list | None = None
    cache: dict[str, tuple[int, Any]] = {}
    while True:
        try:
            capture, newest = _capture_now(directory)
            if not newest:
                _draw(stream, [f"alloctrace top: waiting for a snapshot in {directory}…"])
            else:
                stamps = tuple((path, os.stat(path).st_mtime_ns) for path in newest)
                if stamps != shown:
                    for path, mtime in stamps:
                        if path not in cache or cache[path][0] != mtime:
                            cache[path] = (mtime, load(path))
                    for stale in set(cache) - set(newest):
                        del cache[stale]
                    snapshots = [cache[path][1] for path in newest]
                    lines = render_capture(
                        directory, snapshots, previous, limit, width(), source, full_paths
                    )
                    clock = time.strftime("%H:%M:%S")
                    lines.append("")
                    lines.append(
                        f"{len(capture.processes)} processes in {directory}, {len(newest)} "
                        f"with a snapshot; redrawn at {clock}, looking every {interval:g} s; "
                        "Ctrl-C to quit"
                    )
                    _draw(stream, lines)
                    shown, previous = stamps, snapshots
        except (OSError, ValueError) as exc:
            _status(stream, f"alloctrace top: {exc}")
        time.sleep(interval)


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _status(stream, text: str) -> None:
    """A line under the screen, replaced by the next one on a terminal."""
    if _is_terminal(stream):
        stream.write(f"\r{text}\x1b[K")
    else:
        stream.write(text + "\n")
    stream.flush()


def _draw(stream, lines: list[str]) -> None:
    # Into a pipe or a file, screens follow one another, without terminal escapes.
    start = CLEAR if _is_terminal(stream) else "\n"
    stream.write(start + "\n".join(lines) + "\n")
    stream.flush()
