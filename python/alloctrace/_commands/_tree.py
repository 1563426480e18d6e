"""Several snapshots at once: capture directories, directories of snapshots, globs and lists of
files, for ``stats``/``top``, ``diff``, ``export`` and ``flamegraph``, and the whole-tree summary
``run`` prints (see :mod:`alloctrace._capture`).

Sizes and counts are summed per site across processes (each line says in how many it appears);
``--by-process`` keeps them apart. A forked child's snapshot holds the blocks it inherited from
its parent that are still alive in it: they are counted in each process, as each process has
them in its own address space (copy-on-write may share the pages themselves).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from collections.abc import Sequence

from .. import _capture, _report, _startup
from . import _common as common
from ._common import CommandError


class Source:
    """One snapshot file to read, and the capture process it belongs to, if any."""

    __slots__ = ("path", "process")

    def __init__(self, path: str, process=None):
        self.path = path
        self.process = process

    @property
    def label(self) -> str:
        if self.process is None:
            return self.path
        return f"pid {self.process.pid} ({self.process.role})"


def is_many(paths: Sequence[str]) -> bool:
    """Whether *paths* name more than one snapshot file: several arguments, a directory or a
    pattern that is not itself a file's name."""
    if len(paths) != 1:
        return True
    path = paths[0]
    return os.path.isdir(path) or (not os.path.exists(path) and glob.has_magic(path))


def resolve(paths: Sequence[str]) -> tuple[list[Source], list[str]]:
    """The snapshot files *paths* name, and notes about processes that left none."""
    sources: list[Source] = []
    notes: list[str] = []
    for path in paths:
        if _capture.is_capture(path):
            try:
                capture = _capture.load_capture(path)
            except OSError as exc:
                raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None
            dropped = [p for p in capture.processes if p.dropped]
            if dropped:
                notes.append(dropped_note(dropped))
            for process in capture.processes:
                if process.dropped:
                    continue
                chosen = process.last_snapshot
                if chosen is None or not os.path.isfile(chosen):
                    notes.append(
                        f"pid {process.pid} ({process.role}) left no snapshot: {process.ending}"
                    )
                    continue
                if process.snapshot is None:
                    notes.append(
                        f"pid {process.pid} ({process.role}): {process.ending}; its last "
                        f"numbered snapshot is used"
                    )
                sources.append(Source(chosen, process))
            notes.extend(untraced_lines(capture))
            if capture.problems:
                notes.append(f"{path}: {len(capture.problems)} unreadable manifest line(s)")
        else:
            sources.extend(Source(name) for name in files_of(path))
    if not sources:
        raise CommandError(f"{', '.join(paths)}: no snapshot to read")
    return sources, notes


def files_of(path: str) -> list[str]:
    """The snapshot files one argument names: a directory's ``*.snap`` files, a pattern's
    matches (for a shell that did not expand it, or a quoted one), else the path itself; in
    name order."""
    if os.path.isdir(path):
        found = sorted(glob.glob(os.path.join(glob.escape(path), "*.snap")))
        if not found:
            raise CommandError(f"{path} holds no manifest and no *.snap file")
        return found
    if not os.path.exists(path) and glob.has_magic(path):
        found = sorted(name for name in glob.glob(path) if os.path.isfile(name))
        if not found:
            raise CommandError(f"{path} matches no file")
        return found
    return [path]


def dropped_note(dropped) -> str:
    """What the sums over a capture leave out: the processes whose files were removed to
    keep it bounded (``ALLOCTRACE_CAPTURE_KEEP``), with their total at exit."""
    size = sum(p.size or 0 for p in dropped)
    return (
        f"{_processes(len(dropped))} had their snapshot files dropped to keep the capture "
        f"bounded (ALLOCTRACE_CAPTURE_KEEP, run --capture-keep): their lines are not in these "
        f"sums; they held {_report.format_size(size)} at exit in all (figures from the manifest)"
    )


#: Python children that were not traced named one by one, at most.
UNTRACED_SHOWN = 10


def untraced_lines(capture) -> list[str]:
    """The children that never traced themselves: Pythons by name (they were meant to be
    traced), the other programs counted."""
    pythons = [u for u in capture.untraced if _capture.looks_like_python(u[1])]
    lines = [
        f"Not traced: pid {pid}, started by {parent}: {' '.join(argv)[:100]}: "
        f"{_capture.untraced_reason(argv)}"
        for pid, argv, parent in pythons[:UNTRACED_SHOWN]
    ]
    if len(pythons) > UNTRACED_SHOWN:
        lines.append(f"Not traced: {len(pythons) - UNTRACED_SHOWN} more Python children")
    others = len(capture.untraced) - len(pythons)
    if others:
        lines.append(f"Not traced: {others} child program(s) that are not Python")
    return lines


def load(paths: Sequence[str], args: argparse.Namespace, peak: bool = False):
    """``(sources, snapshots, notes)`` for *paths*, unfiltered; with *peak*, the peaks."""
    sources, notes = resolve(paths)
    snapshots = []
    identities = []
    for source in sources:
        snapshot = common.load(source.path, getattr(args, "allow_pickle", False))
        metadata = snapshot._data.metadata
        identities.append((metadata.get("pid"), metadata.get("timestamp") or 0.0))
        if peak:
            snapshot = common.peak_of(source.path, snapshot)
        if hasattr(args, "key"):
            common.check_objects(source.path, snapshot, args)
        snapshots.append(snapshot)
    keep = _one_per_process(sources, identities, notes)
    sources = [sources[i] for i in keep]
    snapshots = [snapshots[i] for i in keep]
    try:
        _capture.check_compatible(snapshots, [s.path for s in sources])
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    return sources, snapshots, notes


def _one_per_process(sources: list, identities: list, notes: list[str]) -> list[int]:
    """The indexes of *sources* to keep: of several files of one process outside a capture
    (the same pid in *identities*, ``(pid, time taken)``: a series of numbered snapshots and
    its exit snapshot, ``app.1.snap``, ``app.snap``), only the latest; summing a process's
    snapshots would count its memory once per file. A capture names each process's file."""
    latest: dict[int, int] = {}
    for index, (source, (pid, taken)) in enumerate(zip(sources, identities)):
        if source.process is None and pid is not None:
            if pid not in latest or taken >= identities[latest[pid]][1]:
                latest[pid] = index
    keep = []
    for index, (source, (pid, _)) in enumerate(zip(sources, identities)):
        if source.process is not None or pid is None or latest[pid] == index:
            keep.append(index)
    kept = set(keep)
    for pid, index in latest.items():
        same = sum(1 for i, (p, _) in enumerate(identities) if p == pid and i not in kept)
        if same:
            notes.append(
                f"pid {pid}: {sources[index].path} is used, the latest of its {same + 1} "
                "snapshots (a process counts once; 'alloctrace report' draws a series)"
            )
    return keep


def _described(paths: Sequence[str]) -> str:
    return paths[0] if len(paths) == 1 else f"{len(paths)} inputs"


def _processes(n: int) -> str:
    return "1 process" if n == 1 else f"{n:,} processes"


def combined_lines(
    paths: Sequence[str], sources, snapshots, args: argparse.Namespace, stream
) -> list[str]:
    """The ``stats`` text for several snapshots, summed per site."""
    filtered = [common.filtered(s, args, src.path) for s, src in zip(snapshots, sources)]
    with common.Progress("computing statistics"):
        rows = _capture.combined_statistics(filtered, args.key, args.cumulative)
        sizes = [common.totals(s) for s in filtered]
    stats = [stat for stat, _ in rows]
    limit = common.limit(args)
    shown = stats if limit is None else stats[:limit]
    renderer = common.renderer(common.names(shown), args, stream)
    count = "All" if limit is None else f"Top {len(shown)}"
    names = _report.KEY_SINGULAR if len(shown) == 1 else _report.KEY_TITLES
    what = names[args.key] + (" (cumulative)" if args.cumulative else "")
    where = "at their peaks, " if getattr(snapshots[0], "is_peak", False) else ""
    title = (
        f"{count} {what} {where}summed over {_processes(len(snapshots))} "
        f"({_described(paths)}, traceback_limit={snapshots[0].traceback_limit})"
    )
    lines = renderer.stats(
        stats,
        key_type=args.key,
        cumulative=args.cumulative,
        limit=limit,
        total_size=sum(size for size, _ in sizes),
        total_count=sum(count for _, count in sizes),
        title=title,
        notes=[f", in {_processes(n)}" for _, n in rows[: len(shown)]],
    )
    note = _report.sampling_note(snapshots[0])
    if note is not None:
        lines.insert(1, f"({note})")
    return lines


def by_process_lines(sources, snapshots, args: argparse.Namespace, stream) -> list[str]:
    """One ``stats`` listing per snapshot, the largest total first."""
    from .stats import render_stats

    order = sorted(
        range(len(sources)),
        key=lambda i: common.totals(common.filtered(snapshots[i], args, sources[i].path))[0],
        reverse=True,
    )
    lines: list[str] = []
    for index in order:
        source = sources[index]
        if lines:
            lines.append("")
        if source.process is not None:
            lines.append(f"== {source.label}, {source.process.ending} ==")
        lines.extend(render_stats(source.path, snapshots[index], args, stream))
    return lines


def stats_json(paths, sources, snapshots, args: argparse.Namespace) -> dict:
    _, described = common.filters(args)
    filtered = [common.filtered(s, args, src.path) for s, src in zip(snapshots, sources)]
    rows = _capture.combined_statistics(filtered, args.key, args.cumulative)
    limit = common.limit(args)
    shown = rows if limit is None else rows[:limit]
    sizes = [common.totals(s) for s in filtered]
    processes = [_process_json(source, size) for source, size in zip(sources, sizes)]
    dropped = []
    for path in paths:
        if _capture.is_capture(path):
            dropped.extend(
                _dropped_json(p) for p in _capture.load_capture(path).processes if p.dropped
            )
    return {
        "version": _report.JSON_VERSION,
        "command": "stats",
        "key_type": args.key,
        "cumulative": args.cumulative,
        "inputs": list(paths),
        "processes": processes,
        # Processes whose files were dropped to keep a capture bounded: not in the sums.
        "dropped": dropped,
        "filters": described,
        "total": {"size": sum(s for s, _ in sizes), "count": sum(c for _, c in sizes)},
        "stats": [
            {
                "size": stat.size,
                "count": stat.count,
                "processes": n,
                "traceback": _report.traceback_json(stat.traceback),
                **({"kind": stat.kind} if stat.kind is not None else {}),
            }
            for stat, n in shown
        ],
    }


def execute_stats(args: argparse.Namespace) -> int:
    common.check_key(args)
    sources, snapshots, notes = load(args.files, args, getattr(args, "peak", False))
    if args.json:
        common.write_json(stats_json(args.files, sources, snapshots, args))
        return 0
    if getattr(args, "by_process", False):
        lines = by_process_lines(sources, snapshots, args, sys.stdout)
    else:
        lines = combined_lines(args.files, sources, snapshots, args, sys.stdout)
    _write_notes(notes)
    common.write_lines(lines)
    return 0


def _write_notes(notes: Sequence[str]) -> None:
    for note in notes:
        sys.stderr.write(f"{common.PROG}: note: {note}\n")
    sys.stderr.flush()


def execute_diff(args: argparse.Namespace) -> int:
    """``diff OLD NEW`` where either side is several snapshots (each side summed per site), or
    ``--by-process`` over two captures (one comparison per process, matched by role)."""
    old_sources, old, old_notes = load([args.old], args)
    new_sources, new, new_notes = load([args.new], args)
    _write_notes([*old_notes, *new_notes])
    try:
        _capture.check_compatible([*old, *new], [s.path for s in (*old_sources, *new_sources)])
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    old = [common.filtered(s, args, src.path) for s, src in zip(old, old_sources)]
    new = [common.filtered(s, args, src.path) for s, src in zip(new, new_sources)]
    if args.by_process:
        return _diff_by_process(args, old_sources, old, new_sources, new)
    from .diff import changes

    with common.Progress("comparing snapshots"):
        every = _capture.combined_diff(new, old, args.key, args.cumulative)
        old_totals = [common.totals(s) for s in old]
        new_totals = [common.totals(s) for s in new]
        diffs, total = changes(every, _summed(new_totals), _summed(old_totals))
    limit = common.limit(args)
    if args.json:
        _, described = common.filters(args)
        document = _report.diff_json(
            diffs,
            old=(args.old, _Side(old)),
            new=(args.new, _Side(new)),
            key_type=args.key,
            cumulative=args.cumulative,
            limit=limit,
            filters=described,
            total=total,
        )
        document["rss"] = None
        document["processes"] = {
            "old": [_process_json(s, size) for s, size in zip(old_sources, old_totals)],
            "new": [_process_json(s, size) for s, size in zip(new_sources, new_totals)],
        }
        common.write_json(document)
        return 0
    from .diff import rendered

    common.write_lines(
        rendered(
            diffs,
            total,
            args,
            sys.stdout,
            lambda heading: (
                f"{heading}: {args.new} ({_processes(len(new))}) compared to "
                f"{args.old} ({_processes(len(old))}), summed per site"
            ),
        )
    )
    return 0


def _summed(totals) -> tuple[int, int]:
    return sum(size for size, _ in totals), sum(count for _, count in totals)


class _Side:
    """What the JSON of a diff says of one side made of several snapshots."""

    def __init__(self, snapshots):
        self.traceback_limit = snapshots[0].traceback_limit
        self.sample_interval = snapshots[0].sample_interval
        self.is_peak = False
        self.metadata = None


def _process_json(source: Source, totals: tuple[int, int]) -> dict:
    process = source.process
    return {
        "path": source.path,
        "pid": None if process is None else process.pid,
        "ppid": None if process is None else process.ppid,
        "role": None if process is None else process.role,
        "ending": None if process is None else process.ending,
        "size": totals[0],
        "count": totals[1],
    }


def _dropped_json(process) -> dict:
    return {
        "pid": process.pid,
        "ppid": process.ppid,
        "role": process.role,
        "ending": process.ending,
        "size": process.size,
        "count": process.count,
        "peak": process.peak,
    }


def pair_processes(old_dir: str, old_sources, new_dir: str, new_sources):
    """``(old index, new index)`` pairs of the sources of two captures whose processes play
    the same role (:func:`alloctrace._capture.match_processes`: never by pid); ``None`` for
    the side of a process with no counterpart that left a snapshot."""
    old_capture = _capture.load_capture(old_dir)
    new_capture = _capture.load_capture(new_dir)
    old_at = {s.process.id: i for i, s in enumerate(old_sources)}
    new_at = {s.process.id: j for j, s in enumerate(new_sources)}
    pairs = []
    for i, j in _capture.match_processes(old_capture.processes, new_capture.processes):
        a = old_at.get(old_capture.processes[i].id) if i is not None else None
        b = new_at.get(new_capture.processes[j].id) if j is not None else None
        if a is not None or b is not None:
            pairs.append((a, b))
    return pairs


def _diff_by_process(args, old_sources, old, new_sources, new) -> int:
    from .._snapshot import Snapshot
    from .diff import changes

    if not (_capture.is_capture(args.old) and _capture.is_capture(args.new)):
        raise CommandError(
            "diff --by-process compares two capture directories (their processes are matched "
            "by role)",
            common.USAGE_ERROR,
        )
    first = (old or new)[0]
    empty = Snapshot([], first.traceback_limit, sample_interval=first.sample_interval)
    compared = []
    with common.Progress("comparing snapshots"):
        for i, j in pair_processes(args.old, old_sources, args.new, new_sources):
            before = old[i] if i is not None else empty
            after = new[j] if j is not None else empty
            every = after.compare_to(before, args.key, cumulative=args.cumulative)
            diffs, total = changes(every, common.totals(after), common.totals(before))
            compared.append((i, j, diffs, total))
    # The processes that changed most first.
    compared.sort(key=lambda item: -abs(item[3]["size_diff"]))
    limit = common.limit(args)
    if args.json:
        _, described = common.filters(args)
        entries = []
        for i, j, diffs, total in compared:
            document = _report.diff_json(
                diffs,
                old=("", empty),
                new=("", empty),
                key_type=args.key,
                cumulative=args.cumulative,
                limit=limit,
                filters=described,
                total=total,
            )
            entries.append(
                {
                    "old": None
                    if i is None
                    else _process_json(old_sources[i], common.totals(old[i])),
                    "new": None
                    if j is None
                    else _process_json(new_sources[j], common.totals(new[j])),
                    "total": document["total"],
                    "stats": document["stats"],
                    "other": document["other"],
                }
            )
        common.write_json(
            {
                "version": _report.JSON_VERSION,
                "command": "diff",
                "by_process": True,
                "key_type": args.key,
                "cumulative": args.cumulative,
                "old": {"path": args.old},
                "new": {"path": args.new},
                "filters": described,
                "processes": entries,
            }
        )
        return 0
    from .diff import rendered

    lines: list[str] = []
    for i, j, diffs, total in compared:
        if lines:
            lines.append("")
        if i is not None and j is not None:
            lines.append(
                f"== {old_sources[i].label} in {args.old} -> {new_sources[j].label} in "
                f"{args.new} =="
            )
        elif j is not None:
            lines.append(f"== only in {args.new}: {new_sources[j].label} ==")
        else:
            lines.append(f"== only in {args.old}: {old_sources[i].label} ==")
        lines.extend(rendered(diffs, total, args, sys.stdout, lambda heading: heading))
    common.write_lines(lines)
    return 0


def merged(paths: Sequence[str], args: argparse.Namespace):
    """One snapshot of all the snapshots *paths* name (filters applied), for the exports."""
    sources, snapshots, notes = load(paths, args)
    _write_notes(notes)
    snapshots = [common.filtered(s, args, src.path) for s, src in zip(snapshots, sources)]
    if len(snapshots) == 1:
        return snapshots[0]
    try:
        return _capture.merge_snapshots(snapshots)
    except ValueError as exc:
        raise CommandError(str(exc)) from None


# ---------------------------------------------------------------------- run's summary


def summarise_capture(directory: str, shown: str, stream, limit: int = common.DEFAULT_LIMIT):
    """What ``alloctrace run`` prints after a traced process tree ends: one line per process,
    the totals, and the top lines summed over the processes."""
    try:
        capture = _capture.load_capture(directory)
    except OSError as exc:
        stream.write(f"{common.PROG}: no capture was written to {shown}: {exc.strerror or exc}\n")
        return
    rows = []
    snapshots = []
    unreadable = []
    dropped = [p for p in capture.processes if p.dropped]
    for process in capture.processes:
        if process.dropped:
            continue
        path = process.last_snapshot
        snapshot = None
        if path is not None and os.path.isfile(path):
            try:
                snapshot = common.load(path)
            except CommandError as exc:
                unreadable.append(f"pid {process.pid}: {exc}")
        rows.append((process, snapshot))
        if snapshot is not None:
            snapshots.append(snapshot)
    lines = [f"{_processes(len(capture.processes))} traced into {shown}:"]
    if dropped:
        lines[0] = (
            f"{_processes(len(capture.processes))} traced into {shown} ("
            f"{_processes(len(capture.processes) - len(dropped))} with their snapshots):"
        )
    header = f"  {'PID':>7} {'PARENT':>7}  {'AT EXIT':>10} {'PEAK':>10}  ENDED / ROLE"
    lines.append(header)
    total = 0
    peak_sum = 0
    killed = 0
    for process, snapshot in rows:
        if snapshot is not None:
            size = common.totals(snapshot)[0]
            peak = snapshot.peak
            peak_size = common.totals(peak)[0] if peak is not None else size
            if process.snapshot is not None:
                total += size
            peak_sum += max(peak_size, size)
            figures = f"{_report.format_size(size):>10} {_report.format_size(peak_size):>10}"
        else:
            figures = f"{'-':>10} {'-':>10}"
        if process.killed:
            killed += 1
        lines.append(
            f"  {process.pid:>7} {process.ppid:>7}  {figures}  {process.ending}; {process.role}"
        )
    for parent, group in _by_parent(dropped):
        size = sum(p.size or 0 for p in group)
        total += size
        peak_sum += sum(max(p.peak or 0, p.size or 0) for p in group)
        peak = max(max(p.peak or 0, p.size or 0) for p in group)
        endings = _counted(p.ending.split(";")[0] for p in group)
        lines.append(
            f"  {len(group):>7} {parent:>7}  {_report.format_size(size):>10} "
            f"{_report.format_size(peak):>10}  {endings}; children of {parent} whose "
            "snapshots were dropped (capture bound): their sum at exit, the largest peak"
        )
    lines.append(
        f"Traced at exit, all processes: {_report.format_size(total)}; combined peak at most "
        f"{_report.format_size(peak_sum)} (the sum of each process's own peak: an upper "
        "bound, as the processes need not have peaked at the same moment)"
    )
    if killed:
        lines.append(
            f"{killed} process{'es' if killed > 1 else ''} ended without an exit snapshot "
            "(SIGKILL, the OOM killer, os._exit or a crash): at exit figures are missing for "
            "them; their last numbered snapshot is used when they wrote one"
        )
    lines.extend(untraced_lines(capture))
    lines.extend(f"Unreadable: {text}" for text in unreadable)
    if dropped:
        lines.append(dropped_note(dropped).replace("these sums", "the lines below"))
    if snapshots:
        args = argparse.Namespace(
            key="lineno",
            cumulative=False,
            limit=limit,
            filters=[],
            domains=None,
            full_paths=False,
            no_source=False,
        )
        lines.append("")
        try:
            # Exit snapshots only: a killed process's numbered snapshot is of an earlier moment.
            exits = [s for (p, s) in rows if s is not None and p.snapshot is not None]
            if exits:
                sources = [Source(shown)] * len(exits)
                lines.extend(combined_lines([shown], sources, exits, args, stream))
        except ValueError as exc:
            lines.append(f"{common.PROG}: {exc}")
    stream.write("\n".join(lines) + "\n")
    stream.write(
        f"{common.PROG}: capture written to {shown}; see '{common.PROG} stats {shown}' "
        f"(--by-process for each process apart)\n"
    )
    stream.flush()


def _by_parent(processes) -> list:
    """``(parent pid, processes)`` groups, in the order their first member started."""
    groups: dict[int, list] = {}
    for process in processes:
        groups.setdefault(process.ppid, []).append(process)
    return list(groups.items())


def _counted(texts) -> str:
    """``exit 0 (38), killed by SIGTERM (2)``: each text once, with how often it came."""
    from collections import Counter

    return ", ".join(f"{text} ({n})" for text, n in Counter(texts).items())


# ---------------------------------------------------------------------- 'run'


def add_run_options(parser) -> None:
    """--capture/--no-capture: the whole process tree into one directory (issue 57)."""
    parser.add_argument(
        "--capture",
        metavar="DIR",
        help="directory for the snapshots of every process of the program (forked, "
        "multiprocessing and Python subprocess children too) and its manifest.jsonl "
        "(default: alloctrace-NAME-TIME; see ALLOCTRACE_CAPTURE)",
    )
    parser.add_argument(
        "--no-capture",
        action="store_true",
        help="no capture directory: each process writes its own snapshot file (as -o) and "
        "the summary covers the program's own process only",
    )
    parser.add_argument(
        "--capture-keep",
        metavar="N",
        help="at most N ended processes (besides the program itself) keep their snapshot "
        "files in the capture: beyond that, the earliest-ended workers of the busiest parent "
        "have theirs removed, and the "
        "manifest keeps their line and figures at exit (default 100; 0: keep all; see "
        "ALLOCTRACE_CAPTURE_KEEP)",
    )


def capture_directory(args: argparse.Namespace, name: str) -> str | None:
    """The capture directory of this run, created empty; ``None`` without a capture."""
    if args.no_capture or (args.output is not None and args.capture is None):
        if args.capture is not None:
            raise CommandError("--capture and --no-capture contradict each other", 2)
        return None
    if args.output is not None:
        raise CommandError("-o/--output names one file per process: not with --capture", 2)
    if args.capture is not None:
        directory = args.capture
        if os.path.exists(os.path.join(directory, _capture.MANIFEST)):
            raise CommandError(f"{directory} already holds a capture; name another directory")
    else:
        import time

        base = f"alloctrace-{name}-{_startup.format_time(time.time())}"
        directory, number = base, 1
        while os.path.exists(directory):
            number += 1
            directory = f"{base}-{number}"
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise CommandError(f"cannot create {directory}: {exc.strerror or exc}") from None
    return directory


def finish_capture(directory: str, pid: int, status: int, quiet: bool, single) -> None:
    """Record how the program's own process (*pid*) ended (*status*, negative for a signal),
    wait for its descendants, then summarise the tree; a program of one process gets the
    summary of its own snapshot, from *single* (a function of the snapshot's path)."""
    recorder = _capture.Recorder(directory)
    fields = {"signal": _signal_name(-status)} if status < 0 else {"code": status}
    recorder.write("reaped", pid=pid, by=os.getpid(), **fields)
    capture = _settled_capture(directory)
    if quiet:
        return
    if capture is not None and len(capture.processes) == 1 and not capture.untraced:
        path = capture.processes[0].snapshot
        if path is not None and os.path.isfile(path):
            single(path if os.path.isabs(directory) else os.path.relpath(path))
            return
    summarise_capture(directory, directory, sys.stderr)


#: How long ``run`` waits, after the program's own process ended, for descendants still
#: running to write their exit snapshots (multiprocessing's resource tracker and forkserver
#: end just after the program does).
SETTLE_SECONDS = 3.0


def _settled_capture(directory: str):
    """The capture once every traced process that is still alive has ended, or after
    :data:`SETTLE_SECONDS`; ``None`` if it has no manifest."""
    import time

    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        try:
            capture = _capture.load_capture(directory)
        except OSError:
            return None
        running = [p for p in capture.processes if p.killed and _alive(p.pid)]
        if not running or time.monotonic() > deadline:
            return capture
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Whether process *pid* still runs (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            state = file.read().rpartition(b")")[2].split()[:1]
    except OSError:
        return False
    return state != [b"Z"]


def _signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
