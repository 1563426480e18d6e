"""A self-contained HTML report of one or more snapshots of one process.

``alloctrace report FILE... -o report.html`` loads the snapshots (typically the numbered series
that ``ALLOCTRACE_INTERVAL`` writes), puts them in time order, and writes one HTML file that
needs no network: the template (``report_template.html`` beside this module, with its styles
and scripts inline) plus the figures as one JSON document. The page draws traced memory over
time, with the peak and the top lines stacked; a table of the top lines of the snapshot picked
on the chart, with their growth since the previous or the first snapshot; a flamegraph with
zoom and search, and, for a dump that carries its session's peak (``Snapshot.peak``), the
flamegraph and the top lines at the peak; and the object kinds and retention reports where the
snapshots recorded them.

Everything is aggregated here, per line and per stack, before it is embedded: the page never
holds a trace. Each snapshot contributes at most :data:`TABLE_LINES` lines by size plus the
:data:`DIFF_LINES` lines that changed most, and a flamegraph cut to its largest frames
(:func:`_flame_budget`), so a report stays small (a few hundred KiB per snapshot at most)
whatever the number of traces.

The chart and the flamegraph are hand-written SVG and HTML driven by a few hundred lines of
plain JavaScript: no library to bundle or licence, every drawn point is an element the page
and its tests can query, and the size of the page does not depend on a third party.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from . import _output, _report
from ._source import line as _source_line

#: Bumped when the embedded JSON document changes shape (the template reads it).
DATA_VERSION = 1
#: Lines kept per snapshot for its table, by size.
TABLE_LINES = 150
#: Lines kept per snapshot and baseline (previous, first) for the diff, by size of the change.
DIFF_LINES = 60
#: Lines drawn as stacked series on the chart (by their largest size in the series).
SERIES_LINES = 6
#: Lines listed for a peak stored with a snapshot, by size.
PEAK_LINES = 40
#: Object kinds listed per snapshot.
KIND_LINES = 40
#: Source lines are cut to this many characters.
SOURCE_WIDTH = 160
#: Flamegraph frames kept over all snapshots, and at least / at most per snapshot.
FLAME_TOTAL = 40_000
FLAME_MIN = 400
FLAME_MAX = 6_000

_TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report_template.html")
_DATA_MARK = "/*ALLOCTRACE_DATA*/null"
_TITLE_MARK = "<!--ALLOCTRACE_TITLE-->"
_MARKS_RE = re.compile(f"{re.escape(_TITLE_MARK)}|{re.escape(_DATA_MARK)}")
# "function (file:line)" or "file:line": the frame labels of Snapshot.to_collapsed().
_LABEL_RE = re.compile(
    r"^(?:(?P<function>.*) \((?P<file1>.*):(?P<line1>\d+)\)|(?P<file2>.*):(?P<line2>\d+))$"
)


class ReportError(ValueError):
    """Snapshots that cannot make one report; the message names the file and the problem."""


def load_series(paths: Sequence[str], allow_pickle: bool = False) -> list[tuple[str, Any]]:
    """Load snapshot files and put them in time order.

    The order is that of the timestamps the snapshots recorded (``metadata["timestamp"]``,
    the time :func:`alloctrace.take_snapshot` ran), whatever order *paths* come in; a snapshot
    without one (built by hand) takes its file's modification time. Raise :class:`ReportError`
    if there are no files, if one cannot be read, or if they do not belong together: written
    by different processes, or some sampled and others exact (or sampled at another interval).
    """
    import alloctrace

    if not paths:
        raise ReportError("no snapshot files given")
    loaded = []
    for path in paths:
        try:
            snapshot = alloctrace.Snapshot.load(path, allow_pickle=allow_pickle)
        except alloctrace.SnapshotFormatError as exc:
            message = str(exc) or type(exc).__name__
            raise ReportError(message if path in message else f"{path}: {message}") from None
        except OSError as exc:
            raise ReportError(f"cannot read {path}: {exc.strerror or exc}") from None
        metadata = snapshot.metadata or {}
        stamp = metadata.get("timestamp")
        if stamp is None:
            stamp = os.stat(path).st_mtime
        loaded.append((float(stamp), path, snapshot))
    first_stamp, first_path, first = loaded[0]
    first_pid = (first.metadata or {}).get("pid")
    for _, path, snapshot in loaded[1:]:
        pid = (snapshot.metadata or {}).get("pid")
        if first_pid is None:
            first_pid, first_path = pid, path
        elif pid is not None and pid != first_pid:
            raise ReportError(
                f"{path}: written by process {pid}, but {first_path} by process {first_pid}: "
                "a report shows the snapshots of one process"
            )
    _, base_path, base = loaded[0]
    for _, path, snapshot in loaded[1:]:
        if snapshot.sample_interval != base.sample_interval:
            raise ReportError(
                f"{path}: {_mode(snapshot)}, but {base_path} is {_mode(base)}: a report "
                "cannot mix exact and sampled figures"
            )
    loaded.sort(key=lambda item: item[0])
    return [(path, snapshot) for _, path, snapshot in loaded]


def _mode(snapshot) -> str:
    interval = snapshot.sample_interval
    if interval is None:
        return "exact"
    return f"sampled at {_report.format_interval(interval)}"


def _flame_budget(count: int) -> int:
    return max(FLAME_MIN, min(FLAME_MAX, FLAME_TOTAL // max(count, 1)))


class _Strings:
    """A table of strings embedded once, referred to by index."""

    def __init__(self):
        self.items: list[str] = []
        self._index: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        index = self._index.get(text)
        if index is None:
            index = self._index[text] = len(self.items)
            self.items.append(text)
        return index


def _folded(snapshot) -> list[tuple[list[str], int]]:
    """The snapshot's stacks (oldest frame first) and their bytes, via Snapshot.to_collapsed."""
    handle, path = tempfile.mkstemp(prefix="alloctrace-report-", suffix=".folded")
    os.close(handle)
    try:
        snapshot.to_collapsed(path)
        with open(path, encoding="utf-8", errors="replace") as stream:
            text = stream.read()
    finally:
        os.unlink(path)
    stacks = []
    for line in text.splitlines():
        stack, _, size = line.rpartition(" ")
        if stack:
            stacks.append((stack.split(";"), int(size)))
    return stacks


def _flame(stacks, budget: int, label) -> list[int]:
    """A flamegraph tree as flat ``[name, bytes, depth, ...]`` in depth-first order.

    Only the *budget* largest frames are kept (a child is never larger than its parent, so
    what is kept is still a tree); what is cut shows as the gap under its parent.
    """
    root: list[Any] = [0, {}]
    for frames, size in stacks:
        node = root
        node[0] += size
        for frame in frames:
            child = node[1].get(frame)
            if child is None:
                child = node[1][frame] = [0, {}]
            child[0] += size
            node = child
    # (value, -depth, order): larger first, parents before children on ties.
    everything = []
    pending = [(root, 0)]
    while pending:
        node, depth = pending.pop()
        everything.append((node[0], -depth, len(everything), id(node)))
        pending.extend((child, depth + 1) for child in node[1].values())
    everything.sort(reverse=True)
    kept = {entry[3] for entry in everything[:budget]}
    out: list[int] = []

    def walk(name: str, node, depth: int) -> None:
        out.extend((label(name), node[0], depth))
        for child_name, child in sorted(node[1].items(), key=lambda item: -item[1][0]):
            if id(child) in kept:
                walk(child_name, child, depth + 1)

    walk("all", root, 0)
    return out


def _source(filename: str, lineno: int) -> str:
    text = _source_line(filename, lineno)
    if len(text) > SOURCE_WIDTH:
        text = text[: SOURCE_WIDTH - 1] + "…"
    return text


def build_data(series: Sequence[tuple[str, Any]], title: str | None = None) -> dict[str, Any]:
    """The JSON document the page draws from; *series* as :func:`load_series` returns it."""
    snapshots = [snapshot for _, snapshot in series]
    folded = [_folded(snapshot) for snapshot in snapshots]
    # The peaks stored with the snapshots: every dump of a series carries the session's peak
    # so far, so the same one is usually stored many times and is embedded once.
    peak_of: list[int | None] = []
    distinct: dict[tuple[Any, ...], int] = {}
    peak_snapshots = []
    for snapshot in snapshots:
        peak = snapshot.peak
        if peak is None:
            peak_of.append(None)
            continue
        stacks = _folded(peak)
        key = tuple((tuple(frames), size) for frames, size in stacks)
        if key not in distinct:
            distinct[key] = len(peak_snapshots)
            peak_snapshots.append((peak, stacks))
        peak_of.append(distinct[key])
    peak_stats = [peak.statistics("lineno") for peak, _ in peak_snapshots]
    filenames = set()
    for stacks in folded + [stacks for _, stacks in peak_snapshots]:
        for frames, _ in stacks:
            for frame in frames:
                match = _LABEL_RE.match(frame)
                if match:
                    # An empty file name is a name too (a frame of code compiled from "").
                    file1 = match["file1"]
                    filenames.add(file1 if file1 is not None else match["file2"])
    stats = [snapshot.statistics("lineno") for snapshot in snapshots]
    for rows in stats + peak_stats:
        filenames.update(frame.filename for stat in rows for frame in stat.traceback)
    shorten = _report.PathShortener(filenames)

    # Function of each line, from the frame labels of the stacks.
    functions: dict[tuple[str, int], str] = {}
    names = _Strings()
    label_cache: dict[str, int] = {}

    def label(frame: str) -> int:
        index = label_cache.get(frame)
        if index is None:
            match = _LABEL_RE.match(frame)
            shown = frame
            if match:
                if match["file1"] is not None:
                    key = (match["file1"], int(match["line1"]))
                    functions.setdefault(key, match["function"])
                    shown = f"{match['function']} ({shorten(key[0])}:{key[1]})"
                else:
                    shown = f"{shorten(match['file2'])}:{match['line2']}"
            index = label_cache[frame] = names(shown)
        return index

    budget = _flame_budget(len(snapshots) + len(peak_snapshots))
    flames = [_flame(stacks, budget, label) for stacks in folded]
    peak_flames = [_flame(stacks, budget, label) for _, stacks in peak_snapshots]

    files = _Strings()
    sites: list[list[Any]] = []
    site_index: dict[tuple[str, int], int] = {}

    def site(traceback) -> int:
        if len(traceback):
            key = (traceback[0].filename, traceback[0].lineno)
        else:
            key = ("[no frames]", 0)
        index = site_index.get(key)
        if index is None:
            index = site_index[key] = len(sites)
            function = functions.get(key)
            sites.append([files(shorten(key[0])), key[1], function, _source(*key)])
        return index

    totals = []
    per_line: list[dict[int, tuple[int, int]]] = []
    for rows in stats:
        sizes = {site(stat.traceback): (stat.size, stat.count) for stat in rows}
        per_line.append(sizes)
        totals.append((sum(stat.size for stat in rows), sum(stat.count for stat in rows)))

    documents = []
    for i, ((path, snapshot), rows) in enumerate(zip(series, stats)):
        keep = [site(stat.traceback) for stat in rows[:TABLE_LINES]]
        diffs: dict[str, dict[int, tuple[int, int]]] = {}
        for name, j in (("previous", i - 1), ("first", 0)):
            if i == 0 or (name == "first" and i == 1):
                continue
            changes = snapshot.compare_to(snapshots[j], "lineno")
            diffs[name] = {
                site(d.traceback): (d.size_diff, d.count_diff)
                for d in changes
                if d.size_diff or d.count_diff
            }
            biggest = sorted(diffs[name].items(), key=lambda item: -abs(item[1][0]))
            keep.extend(key for key, _ in biggest[:DIFF_LINES])
        if "previous" in diffs and i == 1:
            diffs["first"] = diffs["previous"]
        lines = []
        seen = set()
        for key in keep:
            if key in seen:
                continue
            seen.add(key)
            size, count = per_line[i].get(key, (0, 0))
            row = [key, size, count]
            for name in ("previous", "first"):
                if name in diffs:
                    row.extend(diffs[name].get(key, (0, 0)))
                else:
                    row.extend((None, None))
            lines.append(row)
        metadata = snapshot.metadata or {}
        document: dict[str, Any] = {
            "path": path,
            "time": metadata.get("timestamp"),
            "size": totals[i][0],
            "count": totals[i][1],
            "lines_total": len(rows),
            "lines": lines,
            "flame": flames[i],
            # Index in the document's "peaks", or null: no peak stored with this snapshot.
            "peak": peak_of[i],
            "kinds": None,
            "retention": None,
        }
        if snapshot.has_objects:
            kinds = snapshot.statistics("type")
            document["kinds"] = [[stat.kind, stat.size, stat.count] for stat in kinds[:KIND_LINES]]
            document["kinds_total"] = len(kinds)
        reports = snapshot._data.retention
        if reports:
            from ._snapshot import SiteRetention

            text = "\n\n".join(str(SiteRetention(report)) for report in reports)
            document["retention"] = text.replace(os.getcwd().rstrip("/") + "/", "")
        documents.append(document)

    # Times: recorded ones; a snapshot without one is placed one second after the previous.
    previous_time = None
    for document in documents:
        if document["time"] is None:
            document["time"] = previous_time + 1.0 if previous_time is not None else 0.0
        previous_time = document["time"]

    peaks = []
    for flame, rows in zip(peak_flames, peak_stats):
        peaks.append(
            {
                "size": sum(stat.size for stat in rows),
                "count": sum(stat.count for stat in rows),
                "lines": [
                    [site(stat.traceback), stat.size, stat.count] for stat in rows[:PEAK_LINES]
                ],
                "flame": flame,
            }
        )

    peak = max(range(len(documents)), key=lambda i: documents[i]["size"])
    largest: dict[int, int] = {}
    for sizes in per_line:
        for key, (size, _) in sizes.items():
            largest[key] = max(largest.get(key, 0), size)
    top = sorted(largest, key=lambda key: -largest[key])[:SERIES_LINES]
    first = snapshots[0].metadata or {}
    version = first.get("python_version")
    if version and not isinstance(version, str):
        version = ".".join(str(part) for part in version)
    return {
        "version": DATA_VERSION,
        "title": title or _default_title(first),
        "generated": time.time(),
        "pid": first.get("pid"),
        "argv": list(first.get("argv") or []),
        "python": version,
        "traceback_limit": snapshots[0].traceback_limit,
        "sampled": _report.sampling_note(snapshots[0]),
        "files": files.items,
        "sites": sites,
        "names": names.items,
        "peak": peak,
        "series": [
            {"site": key, "sizes": [sizes.get(key, (0, 0))[0] for sizes in per_line]} for key in top
        ],
        "snapshots": documents,
        "peaks": peaks,
    }


def _default_title(metadata: dict[str, Any]) -> str:
    argv = metadata.get("argv") or []
    if argv:
        program = os.path.basename(argv[0]) or argv[0]
        return f"alloctrace report: {program}"
    return "alloctrace report"


def render(data: dict[str, Any]) -> str:
    """The HTML page for *data* (from :func:`build_data`)."""
    with open(_TEMPLATE, encoding="utf-8") as stream:
        template = stream.read()
    # Inside <script>, "</script>" or "<!--" in a file name would end or confuse the element.
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    payload = payload.replace("<", "\\u003c").replace("\u2028", "\\u2028")
    payload = payload.replace("\u2029", "\\u2029")
    title = data["title"].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    # One pass over the template: a title holding the data marker stays a title.
    pieces = {_TITLE_MARK: title, _DATA_MARK: payload}
    return _MARKS_RE.sub(lambda match: pieces[match.group(0)], template)


def write_report(
    paths: Sequence[str],
    output: str,
    *,
    title: str | None = None,
    allow_pickle: bool = False,
) -> dict[str, Any]:
    """Load *paths*, write the report to *output*, and return the embedded data.

    The page is written as :mod:`alloctrace._output` writes: to a temporary file beside
    *output* renamed over it (so a failure never leaves half a report in place of a good
    one), readable by its owner only unless ``ALLOCTRACE_FILE_MODE`` says otherwise; ``-``
    (or ``/dev/stdout``) is standard output, and any other special file an
    :exc:`alloctrace._output.OutputError`.
    """
    _output.check(output)
    series = load_series(paths, allow_pickle=allow_pickle)
    data = build_data(series, title)
    _output.write(output, render(data).encode("utf-8"))
    return data
