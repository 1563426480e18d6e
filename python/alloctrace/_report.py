"""Rendering of statistics and differences for the ``alloctrace`` command line.

The command line (``_commands``) loads snapshots and computes statistics; this module turns the
results into text for people (sizes in KiB/MiB, short file names, lines that fit the terminal)
or into the versioned JSON object documented in the README, for programs. Keeping rendering
apart lets the ``run`` summary reuse exactly what ``stats`` prints.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import Any, Callable

from . import _source

#: Bumped only when a field of the JSON output changes meaning or disappears.
JSON_VERSION = 1

KEY_TITLES = {
    "lineno": "lines",
    "filename": "files",
    "traceback": "tracebacks",
    "type": "object kinds",
    "lineno+type": "lines and object kinds",
}
KEY_SINGULAR = {
    "lineno": "line",
    "filename": "file",
    "traceback": "traceback",
    "type": "object kind",
    "lineno+type": "line and object kind",
}

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_STDLIB_RE = re.compile(r"/lib/python3\.\d+/")
_SITE_MARKERS = ("/site-packages/", "/dist-packages/")


def format_size(size: int, signed: bool = False) -> str:
    """A byte count for people: ``512 B``, ``12.3 MiB``; *signed* adds ``+`` to gains."""
    sign = ""
    if size < 0:
        sign = "-"
    elif signed:
        sign = "+"
    value = float(abs(size))
    for unit in _UNITS:
        if value < 1024.0 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.1f} {unit}"
        value /= 1024.0
    raise AssertionError("unreachable: the last unit always returns")


def format_interval(size: int) -> str:
    """A sampling interval: ``512 KiB``, ``2 MiB`` when it is a whole number of units."""
    for unit in reversed(_UNITS[1:]):
        scale = 1024 ** _UNITS.index(unit)
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return format_size(size)


def sampling_note(snapshot) -> str | None:
    """The warning a sampled snapshot's figures carry; ``None`` for an exact snapshot."""
    interval = getattr(snapshot, "sample_interval", None)
    if interval is None:
        return None
    return f"sampled, interval {format_interval(interval)}: sizes and counts are estimates"


def process_memory_note(traced: int, snapshot) -> str | None:
    """'traced X of RSS Y' for a snapshot that recorded the process's memory; ``None``
    otherwise. *traced* is the snapshot's whole traced total (before any filter: the RSS is
    the whole process's). The kernel's split of the RSS is in ``--json``."""
    pm = getattr(snapshot, "process_memory", None)
    if pm is None:
        return None
    if getattr(snapshot, "is_peak", False):
        # The RSS was read when the dump was written, not at the traced peak: the kernel's
        # high-water mark is the figure to set against it.
        return f"traced {format_size(traced)} at the peak; peak RSS {format_size(pm.peak_rss)}"
    return f"traced {format_size(traced)} of RSS {format_size(pm.rss)}"


def process_memory_json(traced: int, snapshot) -> dict[str, int] | None:
    """The figures of :func:`process_memory_note`, for ``--json`` (bytes)."""
    pm = getattr(snapshot, "process_memory", None)
    if pm is None:
        return None
    return {"traced": traced, **pm._asdict()}


def rss_change(old: tuple[int, Any], new: tuple[int, Any]) -> dict[str, int] | None:
    """The RSS of two snapshots and its change, beside their traced totals: *old* and *new*
    are ``(traced, snapshot)``, *traced* the whole snapshot's total (before any filter).

    ``None`` unless both recorded the process's memory, and for a peak snapshot, whose RSS
    was read when its dump was written, not at the traced peak."""
    (old_traced, old_snapshot), (new_traced, new_snapshot) = old, new
    pms = []
    for snapshot in (old_snapshot, new_snapshot):
        pm = getattr(snapshot, "process_memory", None)
        if pm is None or getattr(snapshot, "is_peak", False):
            return None
        pms.append(pm)
    return {
        "old": pms[0].rss,
        "new": pms[1].rss,
        "diff": pms[1].rss - pms[0].rss,
        "traced_old": old_traced,
        "traced_new": new_traced,
        "traced_diff": new_traced - old_traced,
    }


def rss_change_lines(change: dict[str, int], width: int | None = None) -> list[str]:
    """The header of ``alloctrace diff`` for :func:`rss_change`'s figures: one line, or two
    (RSS, then traced) where one would not fit in *width*."""
    rss = (
        f"RSS {format_size(change['old'])} -> {format_size(change['new'])} "
        f"({format_size(change['diff'], signed=True)})"
    )
    traced = (
        f"traced {format_size(change['traced_old'])} -> {format_size(change['traced_new'])} "
        f"({format_size(change['traced_diff'], signed=True)})"
    )
    line = f"({rss}; {traced})"
    if width is None or len(line) <= width:
        return [line]
    return [fit_head(f"({rss})", width), fit_head(f"({traced})", width)]


def format_count(count: int, signed: bool = False) -> str:
    """A block count with thousands separators; *signed* adds ``+`` to gains."""
    return f"{count:+,}" if signed else f"{count:,}"


def _blocks(count: int, signed: bool = False) -> str:
    noun = "block" if abs(count) == 1 else "blocks"
    return f"{format_count(count, signed)} {noun}"


class PathShortener:
    """Shortens file names for display where the short form stays unambiguous.

    A file under the current directory is shown relative to it; one in a ``site-packages`` or
    ``dist-packages`` directory relative to that directory; one in the standard library
    (``.../lib/python3.X/``) relative to it. If two different files would get the same short
    name, both keep their full names. Names like ``<frozen importlib._bootstrap>`` are kept.
    """

    def __init__(self, filenames: Iterable[str], cwd: str | None = None, enabled: bool = True):
        self._short: dict[str, str] = {}
        if not enabled:
            return
        cwd = os.path.abspath(cwd if cwd is not None else os.getcwd())
        by_short: dict[str, set[str]] = {}
        for filename in set(filenames):
            short = self._candidate(filename, cwd)
            by_short.setdefault(short, set()).add(filename)
        for short, originals in by_short.items():
            if len(originals) == 1:
                self._short[next(iter(originals))] = short

    @staticmethod
    def _candidate(filename: str, cwd: str) -> str:
        if not filename.startswith("/"):
            return filename
        prefix = cwd.rstrip("/") + "/"
        if filename.startswith(prefix):
            return filename[len(prefix) :]
        for marker in _SITE_MARKERS:
            index = filename.rfind(marker)
            if index >= 0:
                return filename[index + len(marker) :]
        matches = list(_STDLIB_RE.finditer(filename))
        if matches:
            return filename[matches[-1].end() :]
        return filename

    def __call__(self, filename: str) -> str:
        return self._short.get(filename, filename)


def fit_tail(text: str, width: int | None) -> str:
    """Cut *text* to *width* by dropping its start (locations end with the useful part)."""
    if width is None or len(text) <= width or width < 2:
        return text
    return "…" + text[len(text) - width + 1 :]


def fit_head(text: str, width: int | None) -> str:
    """Cut *text* to *width* by dropping its end."""
    if width is None or len(text) <= width or width < 2:
        return text
    return text[: width - 1] + "…"


def _fit_location(prefix: str, location: str, rest: str, width: int | None) -> str:
    """``prefix + location + rest``, cutting the start of the location first, so that the rank
    and the figures stay whole as long as the width allows."""
    if width is None or len(prefix) + len(location) + len(rest) <= width:
        return prefix + location + rest
    room = max(width - len(prefix) - len(rest), 12)
    return fit_head(prefix + fit_tail(location, room) + rest, width)


def _source_line(filename: str, lineno: int) -> str:
    # Only from files that are safe to read for a snapshot from anyone (see _source).
    return _source.line(filename, lineno)


def _frames(traceback: Sequence) -> list:
    return list(traceback)


class Renderer:
    """Text output for statistics and differences, for one terminal width and path style."""

    def __init__(
        self,
        width: int | None = None,
        shorten: Callable[[str], str] | None = None,
        source: bool = True,
    ):
        self.width = width
        self.shorten = shorten if shorten is not None else (lambda name: name)
        self.source = source

    def _location(self, frame, key_type: str) -> str:
        name = self.shorten(frame.filename)
        if key_type == "filename":
            return name
        return f"{name}:{frame.lineno}"

    def _with_source(self, lines: list[str], frame, indent: str) -> None:
        if not self.source:
            return
        text = _source_line(frame.filename, frame.lineno)
        if text:
            lines.append(fit_head(indent + text, self.width))

    def _entry(
        self, lines: list[str], rank: int, traceback, key_type: str, figures: str, kind=None
    ) -> None:
        frames = _frames(traceback)
        if key_type == "type" or (key_type == "lineno+type" and not frames):
            lines.append(fit_head(f"#{rank}: {kind}: {figures}", self.width))
            return
        if key_type == "lineno+type":
            frame = frames[-1]
            location = self._location(frame, "lineno")
            lines.append(_fit_location(f"#{rank}: ", location, f": {kind}: {figures}", self.width))
            self._with_source(lines, frame, "    ")
            return
        if key_type == "traceback":
            lines.append(fit_head(f"#{rank}: {figures}", self.width))
            for frame in frames:
                lines.append(_fit_location("    ", self._location(frame, "lineno"), "", self.width))
                self._with_source(lines, frame, "        ")
            return
        # One frame for lineno/filename statistics: the allocation site.
        frame = frames[-1]
        lines.append(
            _fit_location(f"#{rank}: ", self._location(frame, key_type), f": {figures}", self.width)
        )
        if key_type == "lineno":
            self._with_source(lines, frame, "    ")

    def stats(
        self,
        stats: Sequence,
        *,
        key_type: str,
        cumulative: bool,
        limit: int | None,
        total_size: int,
        total_count: int,
        title: str,
        notes: Sequence[str] | None = None,
    ) -> list[str]:
        """The "top N" listing: one entry per statistic, the rest summed, then the total.
        *notes*, one per statistic, end their entries' figures (e.g. ", in 3 processes")."""
        lines = [fit_head(title, self.width)]
        shown = stats if limit is None else stats[:limit]
        for rank, stat in enumerate(shown, 1):
            figures = f"{format_size(stat.size)} in {_blocks(stat.count)}"
            if stat.count:
                figures += f" (average {format_size(stat.size // stat.count)})"
            if notes is not None:
                figures += notes[rank - 1]
            self._entry(lines, rank, stat.traceback, key_type, figures, _kind(stat))
        rest = stats[len(shown) :]
        if rest:
            if cumulative:
                # Cumulative entries overlap (one block counts for each of its frames): a sum of
                # them would mean nothing.
                lines.append(f"{len(rest):,} other")
            else:
                size = sum(stat.size for stat in rest)
                count = sum(stat.count for stat in rest)
                lines.append(f"{len(rest):,} other: {format_size(size)} in {_blocks(count)}")
        if not stats:
            lines.append("no traces")
        lines.append(f"Total: {format_size(total_size)} in {_blocks(total_count)}")
        return [fit_head(line, self.width) for line in lines]

    def diff(
        self,
        diffs: Sequence,
        *,
        key_type: str,
        cumulative: bool,
        limit: int | None,
        total: dict[str, int],
        title: str,
    ) -> list[str]:
        """The "top N differences" listing, in the order ``compare_to`` sorted them."""
        lines = [fit_head(title, self.width)]
        shown = diffs if limit is None else diffs[:limit]
        for rank, stat in enumerate(shown, 1):
            figures = (
                f"{format_size(stat.size_diff, True)} ({_blocks(stat.count_diff, True)}), "
                f"now {format_size(stat.size)} in {_blocks(stat.count)}"
            )
            self._entry(lines, rank, stat.traceback, key_type, figures, _kind(stat))
        rest = diffs[len(shown) :]
        if rest:
            if cumulative:
                lines.append(f"{len(rest):,} other changes")
            else:
                size = sum(stat.size_diff for stat in rest)
                count = sum(stat.count_diff for stat in rest)
                lines.append(
                    f"{len(rest):,} other: {format_size(size, True)} ({_blocks(count, True)})"
                )
        if not diffs:
            lines.append("no differences")
        lines.append(
            f"Total: {format_size(total['size_diff'], True)} "
            f"({_blocks(total['count_diff'], True)}), "
            f"now {format_size(total['size'])} in {_blocks(total['count'])}"
        )
        return [fit_head(line, self.width) for line in lines]


def _kind(stat) -> Any:
    return getattr(stat, "kind", None)


def _with_kind(entry: dict[str, Any], stat) -> dict[str, Any]:
    """Adds ``kind`` to a JSON entry of an object-kind statistic (absent otherwise)."""
    kind = _kind(stat)
    if kind is not None:
        entry["kind"] = kind
    return entry


def traceback_json(traceback) -> list[dict[str, Any]]:
    """Frames oldest first, the allocation site last, with the file names as recorded."""
    return [{"filename": frame.filename, "lineno": frame.lineno} for frame in _frames(traceback)]


def snapshot_json(path: str, snapshot) -> dict[str, Any]:
    metadata = getattr(snapshot, "metadata", None)
    return {
        "path": path,
        "traceback_limit": snapshot.traceback_limit,
        "metadata": dict(metadata) if metadata else {},
        # Bytes between samples on average; null for an exact snapshot. When set, every size
        # and count in the document is an estimate.
        "sample_interval": getattr(snapshot, "sample_interval", None),
        # True when the figures are of the moment traced memory peaked (a peak snapshot,
        # e.g. with --peak): per traceback, the total of the blocks alive then.
        "is_peak": bool(getattr(snapshot, "is_peak", False)),
    }


def stats_json(
    stats: Sequence,
    *,
    path: str,
    snapshot,
    key_type: str,
    cumulative: bool,
    limit: int | None,
    filters: list[dict[str, Any]],
    total_size: int,
    total_count: int,
) -> dict[str, Any]:
    shown = stats if limit is None else stats[:limit]
    rest = stats[len(shown) :]
    return {
        "version": JSON_VERSION,
        "command": "stats",
        "key_type": key_type,
        "cumulative": cumulative,
        "snapshot": snapshot_json(path, snapshot),
        "filters": filters,
        "total": {"size": total_size, "count": total_count},
        "stats": [
            _with_kind(
                {
                    "size": stat.size,
                    "count": stat.count,
                    "traceback": traceback_json(stat.traceback),
                },
                stat,
            )
            for stat in shown
        ],
        "other": {
            "entries": len(rest),
            "size": None if cumulative else sum(stat.size for stat in rest),
            "count": None if cumulative else sum(stat.count for stat in rest),
        },
    }


def diff_json(
    diffs: Sequence,
    *,
    old: tuple[str, Any],
    new: tuple[str, Any],
    key_type: str,
    cumulative: bool,
    limit: int | None,
    filters: list[dict[str, Any]],
    total: dict[str, int],
) -> dict[str, Any]:
    shown = diffs if limit is None else diffs[:limit]
    rest = diffs[len(shown) :]
    return {
        "version": JSON_VERSION,
        "command": "diff",
        "key_type": key_type,
        "cumulative": cumulative,
        "old": snapshot_json(*old),
        "new": snapshot_json(*new),
        "filters": filters,
        "total": dict(total),
        "stats": [
            _with_kind(
                {
                    "size": stat.size,
                    "size_diff": stat.size_diff,
                    "count": stat.count,
                    "count_diff": stat.count_diff,
                    "traceback": traceback_json(stat.traceback),
                },
                stat,
            )
            for stat in shown
        ],
        "other": {
            "entries": len(rest),
            "size_diff": None if cumulative else sum(stat.size_diff for stat in rest),
            "count_diff": None if cumulative else sum(stat.count_diff for stat in rest),
        },
    }
