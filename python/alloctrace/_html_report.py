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
whatever the number of traces. A series longer than :data:`EMBEDDED_MAX` embeds that many in
full and the rest as points of the chart. The files are read one at a time, twice (to order
and check them, then to build), so memory holds about three snapshots whatever their number.

The chart and the flamegraph are hand-written SVG and HTML driven by a few hundred lines of
plain JavaScript: no library to bundle or licence, every drawn point is an element the page
and its tests can query, and the size of the page does not depend on a third party.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from typing import Any

from . import _output, _report
from ._source import line as _source_line
from ._source import note_origin as _note_origin
from ._source import scope as _source_scope

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
#: Snapshots embedded in full (table, diffs, flamegraph, kinds, peak); the others of a longer
#: series are points on the chart: their time, total and the chart's top lines.
EMBEDDED_MAX = 200

_TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report_template.html")
_DATA_MARK = "/*ALLOCTRACE_DATA*/null"
_TITLE_MARK = "<!--ALLOCTRACE_TITLE-->"
_MARKS_RE = re.compile(f"{re.escape(_TITLE_MARK)}|{re.escape(_DATA_MARK)}")


class ReportError(ValueError):
    """Snapshots that cannot make one report; the message names the file and the problem."""


class _Scanned:
    """What the first reading of a snapshot file leaves: enough to order the series, check
    that its files belong together, choose which to embed and which lines to chart."""

    __slots__ = ("path", "stamp", "size", "count", "top", "has_peak")

    def __init__(self, path: str, stamp: float, stats, has_peak: bool):
        self.path = path
        self.has_peak = has_peak
        self.stamp = stamp
        self.size = sum(stat.size for stat in stats)
        self.count = sum(stat.count for stat in stats)
        #: (site key, size) of its largest lines: a line among the chart's top lines by its
        #: largest size is among the largest of the snapshot where it is largest.
        self.top = [(_site_key(stat.traceback), stat.size) for stat in stats[:SERIES_LINES]]


def _load(path: str, allow_pickle: bool):
    import alloctrace

    try:
        snapshot = alloctrace.Snapshot.load(path, allow_pickle=allow_pickle)
    except alloctrace.SnapshotFormatError as exc:
        message = str(exc) or type(exc).__name__
        raise ReportError(message if path in message else f"{path}: {message}") from None
    except OSError as exc:
        # The native loader's message names the file already.
        message = exc.strerror or str(exc)
        if path not in message:
            message = f"cannot read {path}: {message}"
        raise ReportError(message) from None
    _note_origin(snapshot, path)
    return snapshot


def _stamp(path: str, snapshot) -> float:
    stamp = (snapshot.metadata or {}).get("timestamp")
    if stamp is None:
        stamp = os.stat(path).st_mtime if os.path.exists(path) else 0.0
    return float(stamp)


def _check_together(items) -> None:
    """Raise :class:`ReportError` unless the ``(path, snapshot)`` pairs of *items* (in the
    order given) come from one process and are all exact or all sampled at one interval."""
    first_path = first_pid = base_path = base = None
    for path, snapshot in items:
        pid = (snapshot.metadata or {}).get("pid")
        if first_pid is None:
            first_pid, first_path = pid, path
        elif pid is not None and pid != first_pid:
            raise ReportError(
                f"{path}: written by process {pid}, but {first_path} by process {first_pid}: "
                "a report shows the snapshots of one process"
            )
        if base is None:
            base_path, base = path, snapshot
        elif snapshot.sample_interval != base.sample_interval:
            raise ReportError(
                f"{path}: {_mode(snapshot)}, but {base_path} is {_mode(base)}: a report "
                "cannot mix exact and sampled figures"
            )


def load_series(paths: Sequence[str], allow_pickle: bool = False) -> list[tuple[str, Any]]:
    """Load snapshot files and put them in time order.

    The order is that of the timestamps the snapshots recorded (``metadata["timestamp"]``,
    the time :func:`alloctrace.take_snapshot` ran), whatever order *paths* come in; a snapshot
    without one (built by hand) takes its file's modification time. Raise :class:`ReportError`
    if there are no files, if one cannot be read, or if they do not belong together: written
    by different processes, or some sampled and others exact (or sampled at another interval).
    Every snapshot stays loaded: :func:`write_report` reads a long series file by file instead.
    """
    if not paths:
        raise ReportError("no snapshot files given")
    loaded = [(path, _load(path, allow_pickle)) for path in paths]
    _check_together(loaded)
    stamped = [(_stamp(path, snapshot), i) for i, (path, snapshot) in enumerate(loaded)]
    stamped.sort()
    return [loaded[i] for _, i in stamped]


def _scan(paths: Sequence[str], allow_pickle: bool) -> list[_Scanned]:
    """The first reading of a series of files, one at a time (one snapshot in memory at a
    time), in time order: the checks of :func:`load_series`, without keeping the snapshots."""
    if not paths:
        raise ReportError("no snapshot files given")
    scanned = []

    def each():
        for path in paths:
            snapshot = _load(path, allow_pickle)
            stats = snapshot.statistics("lineno")
            scanned.append(_Scanned(path, _stamp(path, snapshot), stats, snapshot.peak is not None))
            yield path, snapshot

    _check_together(each())
    scanned.sort(key=lambda item: item.stamp)
    return scanned


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


def _site_key(traceback) -> tuple[str, int]:
    if len(traceback):
        return (traceback[0].filename, traceback[0].lineno)
    return ("[no frames]", 0)


def _source(filename: str, lineno: int) -> str:
    text = _source_line(filename, lineno)
    if len(text) > SOURCE_WIDTH:
        text = text[: SOURCE_WIDTH - 1] + "…"
    return text


def _embedded(scanned: Sequence[_Scanned]) -> set[int]:
    """Which snapshots of the series are embedded in full: all of a series of at most
    :data:`EMBEDDED_MAX`; of a longer one the first, the last, the largest and others evenly
    spaced in between."""
    n = len(scanned)
    if n <= EMBEDDED_MAX:
        return set(range(n))
    largest = max(range(n), key=lambda i: scanned[i].size)
    chosen = {0, n - 1, largest}
    slots = EMBEDDED_MAX - len(chosen)
    chosen.update(round(k * (n - 1) / (slots + 1)) for k in range(1, slots + 1))
    return chosen


def _chart_lines(scanned: Sequence[_Scanned]) -> list[tuple[str, int]]:
    """The :data:`SERIES_LINES` lines with the largest size anywhere in the series."""
    largest: dict[tuple[str, int], int] = {}
    for item in scanned:
        for key, size in item.top:
            if size > largest.get(key, -1):
                largest[key] = size
    return sorted(largest, key=lambda key: -largest[key])[:SERIES_LINES]


class _Builder:
    """The page's JSON document, built one snapshot at a time in time order.

    What it keeps besides the document is the first and the previous snapshot (for the
    growth columns), so a series of any length costs about three snapshots of memory plus what
    the page embeds. File names are kept as recorded until :meth:`finish` shortens them, all
    at once, knowing every name the page shows.
    """

    def __init__(self, scanned: Sequence[_Scanned], title: str | None):
        self.title = title
        self.embedded = _embedded(scanned)
        self.chart = _chart_lines(scanned)
        # Flamegraphs: one per embedded snapshot and at most one per peak stored with one.
        flames = len(self.embedded) + sum(scanned[i].has_peak for i in self.embedded)
        self.budget = _flame_budget(flames)
        self.documents: list[dict[str, Any]] = []
        self.series_sizes: list[list[int]] = [[] for _ in self.chart]
        self.sites: list[tuple[str, int]] = []
        self.site_index: dict[tuple[str, int], int] = {}
        #: Flamegraph frames, (filename, lineno, function) or None, embedded once each.
        self.names: list[Any] = []
        self.name_index: dict[Any, int] = {}
        #: A function name per line, from the flamegraphs' frames.
        self.functions: dict[tuple[str, int], str] = {}
        self.peaks: list[dict[str, Any]] = []
        self.peak_index: dict[Any, int] = {}
        self.first = self.previous = None
        self.first_meta: dict[str, Any] = {}
        self.traceback_limit = 0
        self.sampled = None

    def site(self, traceback) -> int:
        return self.site_of(_site_key(traceback))

    def site_of(self, key: tuple[str, int]) -> int:
        index = self.site_index.get(key)
        if index is None:
            index = self.site_index[key] = len(self.sites)
            self.sites.append(key)
        return index

    def flame(self, snapshot) -> list[int]:
        """The snapshot's flamegraph cut to the budget, its frames as indexes in ``names``."""
        frames, nodes = snapshot._data.flame(self.budget)
        mapped = []
        for frame in frames:
            index = self.name_index.get(frame)
            if index is None:
                index = self.name_index[frame] = len(self.names)
                self.names.append(frame)
                if frame is not None and frame[2] is not None:
                    self.functions.setdefault((frame[0], frame[1]), frame[2])
            mapped.append(index)
        # The root is named "all": index -1 until finish() gives it its place.
        nodes[0::3] = [mapped[i] if i >= 0 else -1 for i in nodes[0::3]]
        return nodes

    def add(self, path: str, snapshot) -> None:
        i = len(self.documents)
        stats = snapshot.statistics("lineno")
        by_key = {_site_key(stat.traceback): stat for stat in stats}
        for sizes, key in zip(self.series_sizes, self.chart):
            stat = by_key.get(key)
            sizes.append(stat.size if stat is not None else 0)
        metadata = snapshot.metadata or {}
        document: dict[str, Any] = {
            "path": path,
            "time": metadata.get("timestamp"),
            "size": sum(stat.size for stat in stats),
            "count": sum(stat.count for stat in stats),
            "lines_total": len(stats),
            # null: a point on the chart only (a long series embeds EMBEDDED_MAX in full).
            "lines": None,
            "flame": None,
            "peak": None,
            "kinds": None,
            "retention": None,
        }
        if i == 0:
            self.first, self.first_meta = snapshot, metadata
            self.traceback_limit = snapshot.traceback_limit
            self.sampled = _report.sampling_note(snapshot)
        if i in self.embedded:
            self._embed(document, snapshot, stats, by_key, i)
        self.documents.append(document)
        self.previous = snapshot

    def _embed(self, document, snapshot, stats, by_key, i: int) -> None:
        # Site keys until the rows are chosen: only the lines shown become sites of the page.
        keep = [_site_key(stat.traceback) for stat in stats[:TABLE_LINES]]
        diffs: dict[str, dict[tuple[str, int], tuple[int, int]]] = {}
        for name, base in (("previous", self.previous), ("first", self.first)):
            if i == 0 or (name == "first" and i == 1):
                continue
            changes = snapshot.compare_to(base, "lineno")
            diffs[name] = {
                _site_key(d.traceback): (d.size_diff, d.count_diff)
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
            stat = by_key.get(key)
            size, count = (stat.size, stat.count) if stat is not None else (0, 0)
            row = [self.site_of(key), size, count]
            for name in ("previous", "first"):
                if name in diffs:
                    row.extend(diffs[name].get(key, (0, 0)))
                else:
                    row.extend((None, None))
            lines.append(row)
        document["lines"] = lines
        document["flame"] = self.flame(snapshot)
        if snapshot.has_objects:
            kinds = snapshot.statistics("type")
            document["kinds"] = [[stat.kind, stat.size, stat.count] for stat in kinds[:KIND_LINES]]
            document["kinds_total"] = len(kinds)
        reports = snapshot._data.retention
        if reports:
            from ._snapshot import SiteRetention

            text = "\n\n".join(str(SiteRetention(report)) for report in reports)
            document["retention"] = text.replace(os.getcwd().rstrip("/") + "/", "")
        document["peak"] = self._peak(snapshot.peak)

    def _peak(self, peak) -> int | None:
        """The index of the peak stored with a snapshot in the document's "peaks": every dump
        of a series carries the session's peak so far, so the same one is usually stored
        many times, and is embedded once (the same figures and flamegraph: the same peak)."""
        if peak is None:
            return None
        rows = peak.statistics("lineno")
        document = {
            "size": sum(stat.size for stat in rows),
            "count": sum(stat.count for stat in rows),
            "lines": [
                [self.site(stat.traceback), stat.size, stat.count] for stat in rows[:PEAK_LINES]
            ],
            "flame": self.flame(peak),
        }
        key = json.dumps(document, separators=(",", ":"))
        index = self.peak_index.get(key)
        if index is None:
            index = self.peak_index[key] = len(self.peaks)
            self.peaks.append(document)
        return index

    def finish(self) -> dict[str, Any]:
        documents = self.documents
        # Times: recorded ones; a snapshot without one is placed one second after the previous.
        previous_time = None
        for document in documents:
            if document["time"] is None:
                document["time"] = previous_time + 1.0 if previous_time is not None else 0.0
            previous_time = document["time"]
        chart = [self.site_of(key) for key in self.chart]
        filenames = {filename for filename, _ in self.sites}
        filenames.update(name[0] for name in self.names if name is not None)
        shorten = _report.PathShortener(filenames)
        files = _Strings()
        sites = [
            [
                files(shorten(filename)),
                lineno,
                self.functions.get((filename, lineno)),
                _source(filename, lineno),
            ]
            for filename, lineno in self.sites
        ]
        labels = _Strings()
        root = labels("all")
        label_of = []
        for name in self.names:
            if name is None:
                label_of.append(labels(EMPTY_STACK))
            elif name[2] is not None:
                label_of.append(labels(f"{name[2]} ({shorten(name[0])}:{name[1]})"))
            else:
                label_of.append(labels(f"{shorten(name[0])}:{name[1]}"))
        for flame in [d["flame"] for d in documents if d["flame"]] + [
            p["flame"] for p in self.peaks
        ]:
            flame[0::3] = [label_of[i] if i >= 0 else root for i in flame[0::3]]
        peak = max(range(len(documents)), key=lambda i: documents[i]["size"])
        version = self.first_meta.get("python_version")
        if version and not isinstance(version, str):
            version = ".".join(str(part) for part in version)
        return {
            "version": DATA_VERSION,
            "title": self.title or _default_title(self.first_meta),
            "generated": time.time(),
            "pid": self.first_meta.get("pid"),
            "argv": list(self.first_meta.get("argv") or []),
            "python": version,
            "traceback_limit": self.traceback_limit,
            "sampled": self.sampled,
            "files": files.items,
            "sites": sites,
            "names": labels.items,
            "peak": peak,
            "embedded": sum(1 for d in documents if d["lines"] is not None),
            "series": [
                {"site": site, "sizes": sizes} for site, sizes in zip(chart, self.series_sizes)
            ],
            "snapshots": documents,
            "peaks": self.peaks,
        }


#: The name of the flamegraph node of stacks without frames.
EMPTY_STACK = "[no frames]"


def build_data(series: Sequence[tuple[str, Any]], title: str | None = None) -> dict[str, Any]:
    """The JSON document the page draws from; *series* as :func:`load_series` returns it."""
    scanned = [
        _Scanned(path, float(i), snapshot.statistics("lineno"), snapshot.peak is not None)
        for i, (path, snapshot) in enumerate(series)
    ]
    builder = _Builder(scanned, title)
    for path, snapshot in series:
        builder.add(path, snapshot)
    return builder.finish()


def _build_from_files(
    paths: Sequence[str], title: str | None, allow_pickle: bool
) -> dict[str, Any]:
    """:func:`build_data` of the files *paths*, reading them one at a time: twice (once to
    order and check them, once to build), so memory holds about three snapshots at most."""
    scanned = _scan(paths, allow_pickle)
    builder = _Builder(scanned, title)
    for item in scanned:
        builder.add(item.path, _load(item.path, allow_pickle))
    return builder.finish()


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
    with _source_scope():
        data = _build_from_files(paths, title, allow_pickle)
    _output.write(output, render(data).encode("utf-8"))
    return data


# ---------------------------------------------------------------------- a process-tree capture

#: Processes drawn on the capture page's chart of memory over time (those with the largest
#: peaks among the processes that wrote numbered snapshots); the table lists every process.
CAPTURE_CHART_PROCESSES = 12
#: Points kept per process on that chart: a longer series keeps evenly spaced ones and the last.
CAPTURE_POINTS = 400


def _tree_order(processes) -> list[tuple[Any, int, int | None]]:
    """``(process, depth, parent index)`` in tree order: each process under the latest
    process of its parent's pid that started before it, children in the order they started."""
    from ._capture import parents

    parent_of = parents(processes)
    children: dict[int | None, list[int]] = {}
    for i, parent in enumerate(parent_of):
        children.setdefault(parent, []).append(i)
    order: list[tuple[Any, int, int | None]] = []
    stack = [(i, 0) for i in reversed(children.get(None, []))]
    while stack:
        i, depth = stack.pop()
        order.append((processes[i], depth, parent_of[i]))
        stack.extend((j, depth + 1) for j in reversed(children.get(i, [])))
    return order


def _thinned(points: list, limit: int) -> list:
    if len(points) <= limit:
        return points
    step = (len(points) - 1) / (limit - 1)
    return [points[round(k * step)] for k in range(limit)]


def build_capture_data(
    directory: str, title: str | None = None, allow_pickle: bool = False
) -> dict[str, Any]:
    """The JSON document of the page of a process-tree capture (a directory with a manifest,
    as ``alloctrace run`` writes it; see :mod:`alloctrace._capture`).

    The page shows the process tree (every process the manifest names, killed ones as such),
    the top lines summed over the processes (each with the number of processes it appears in,
    as ``alloctrace stats DIR`` prints them) and each process's traced memory over time from
    its numbered snapshots. Every snapshot file is read once, one at a time: memory holds one
    snapshot and the per-line sums, whatever the number of processes and files.
    """
    from . import _capture

    try:
        capture = _capture.load_capture(directory)
    except OSError as exc:
        raise ReportError(f"cannot read {directory}: {exc.strerror or exc}") from None
    if not capture.processes:
        raise ReportError(f"{directory}: the manifest names no traced process")
    notes: list[str] = []
    if capture.problems:
        notes.append(f"{len(capture.problems)} unreadable manifest line(s)")
    sums: dict[tuple[str, int], list[int]] = {}
    first = None
    first_path = None
    rows = []
    for process, depth, parent in _tree_order(capture.processes):
        files = [path for path in process.numbered if os.path.isfile(path)]
        if process.snapshot is not None and os.path.isfile(process.snapshot):
            files.append(process.snapshot)
        last = process.last_snapshot
        points = []
        row: dict[str, Any] = {
            "pid": process.pid,
            "ppid": process.ppid,
            "parent": parent,
            "depth": depth,
            "role": process.role,
            "argv": process.argv,
            "started": process.started,
            "ended": process.ended,
            "ending": process.ending,
            "killed": process.killed,
            "signal": process.signal,
            "code": process.code,
            "snapshot": None,
            "numbered": len(process.numbered),
            "size": None,
            "count": None,
            "peak": None,
            "points": points,
            "problem": None,
        }
        for path in files:
            snapshot = _load(path, allow_pickle)
            pid = (snapshot.metadata or {}).get("pid")
            if pid is not None and pid != process.pid:
                row["problem"] = (
                    f"{os.path.basename(path)} was written by process {pid}, not {process.pid}: "
                    "left out"
                )
                continue
            stats = snapshot.statistics("lineno")
            size = sum(stat.size for stat in stats)
            points.append([_stamp(path, snapshot), size])
            if path != last:
                continue
            if first is None:
                first, first_path = snapshot, path
            else:
                try:
                    _capture.check_compatible([first, snapshot], [first_path, path])
                except ValueError as exc:
                    raise ReportError(str(exc)) from None
            row["snapshot"] = os.path.basename(path)
            row["size"] = size
            row["count"] = sum(stat.count for stat in stats)
            peak = snapshot.peak
            row["peak"] = sum(s.size for s in peak.statistics("lineno")) if peak else None
            for stat in stats:
                key = _site_key(stat.traceback)
                entry = sums.get(key)
                if entry is None:
                    sums[key] = [stat.size, stat.count, 1]
                else:
                    entry[0] += stat.size
                    entry[1] += stat.count
                    entry[2] += 1
        if process.dropped:
            # Its files were removed to keep the capture bounded: the manifest's figures.
            row.update(size=process.size, count=process.count, peak=process.peak)
            row["problem"] = "its figures at exit are the manifest's"
        sizes = [size for _, size in points]
        if row["peak"] is None and sizes:
            row["peak"] = max(sizes)
        elif row["peak"] is not None and sizes:
            row["peak"] = max(row["peak"], *sizes)
        points.sort()
        row["points"] = _thinned(points, CAPTURE_POINTS)
        rows.append(row)
    if first is None:
        raise ReportError(f"{directory}: no process of the capture left a readable snapshot")
    from ._commands._tree import untraced_lines

    notes.extend(untraced_lines(capture))
    dropped = [p for p in capture.processes if p.dropped]
    if dropped:
        from ._commands._tree import dropped_note

        notes.append(dropped_note(dropped))
    ranked = sorted(sums.items(), key=lambda item: (-item[1][0], -item[1][1], item[0]))
    top = ranked[:TABLE_LINES]
    keys = [key for key, _ in top]
    shorten = _report.PathShortener({filename for filename, _ in keys})
    files_table = _Strings()
    sites = [[files_table(shorten(f)), n, None, _source(f, n)] for f, n in keys]
    used = [row for row in rows if row["snapshot"] is not None]
    at_exit = [row for row in used if not row["killed"]]
    root = capture.processes[0]
    program = root.role if root.role != "?" else os.path.basename(os.path.abspath(directory))
    return {
        "version": DATA_VERSION,
        "title": title or f"alloctrace report: {program} (process tree)",
        "generated": time.time(),
        "pid": root.pid,
        "argv": root.argv,
        "python": None,
        "traceback_limit": first.traceback_limit,
        "sampled": _report.sampling_note(first),
        "files": files_table.items,
        "sites": sites,
        "names": [],
        "snapshots": [],
        "peaks": [],
        "series": [],
        "capture": {
            "directory": directory,
            "processes": rows,
            "untraced": len(capture.untraced),
            "size": sum(size for size, _, _ in sums.values()),
            "count": sum(count for _, count, _ in sums.values()),
            "merged": len(used),
            "total_at_exit": sum(row["size"] for row in at_exit)
            + sum(p.size or 0 for p in dropped),
            "peak_sum": sum(row["peak"] or 0 for row in rows),
            "lines": [[i, s[0], s[1], s[2]] for i, (_, s) in enumerate(top)],
            "lines_total": len(sums),
            "notes": notes,
            "chart": CAPTURE_CHART_PROCESSES,
        },
    }


def write_capture_report(
    directory: str,
    output: str,
    *,
    title: str | None = None,
    allow_pickle: bool = False,
) -> dict[str, Any]:
    """The page of a process-tree capture (:func:`build_capture_data`), written to *output*
    as :func:`write_report` writes; returns the embedded data."""
    _output.check(output)
    data = build_capture_data(directory, title, allow_pickle)
    _output.write(output, render(data).encode("utf-8"))
    return data
