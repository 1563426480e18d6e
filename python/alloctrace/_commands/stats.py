"""``alloctrace stats`` and ``alloctrace top``: the top allocation sites of one snapshot.

``top`` is ``stats`` with the defaults (lines, no filters, text); ``top --interval`` is the
live view (:mod:`.live`). :func:`render_stats` is also
what ``run`` prints after the program ends.
"""

from __future__ import annotations

import argparse
import sys

from .. import _report
from . import _common as common
from . import live


def register(commands) -> None:
    stats = commands.add_parser(
        "stats",
        help="top allocation sites of a snapshot",
        description="The top allocation sites of a snapshot file, biggest first, grouped by "
        "line, file, traceback or object kind.",
    )
    stats.add_argument(
        "files",
        nargs="+",
        metavar="file",
        help="snapshot file; several files, a capture directory ('alloctrace run') or a quoted "
        "glob are summed per site across processes",
    )
    _add_by_process(stats)
    stats.add_argument(
        "--peak",
        action="store_true",
        help="show the peak stored in the file (what was alive when the traced memory peaked)",
    )
    common.add_report_options(stats)
    stats.set_defaults(handler=execute)

    top = commands.add_parser(
        "top",
        help="the top 10 lines of a snapshot (stats with defaults); with --interval, of the "
        "newest dump of a running process, redrawn live; with --pid, of snapshots asked of it",
        description="The top lines of a snapshot file: 'stats' with its defaults. With "
        "--interval, the top lines of the newest dump matching a pattern, redrawn live.",
    )
    top.add_argument(
        "files",
        nargs="*",
        metavar="file",
        help="snapshot file, several, a capture directory or a glob (summed per site); with "
        "--interval, a pattern such as 'app-*.snap' (quoted)",
    )
    _add_by_process(top)
    live.add_options(top)
    common.add_report_options(top, full=False)
    top.set_defaults(handler=execute_top)


def _add_by_process(parser) -> None:
    parser.add_argument(
        "--by-process",
        action="store_true",
        help="with several snapshots, one listing per process, the largest first",
    )


def execute_top(args: argparse.Namespace) -> int:
    if args.interval is not None or args.pid is not None:
        if len(args.files) > 1:
            raise common.CommandError("top --interval follows one pattern", common.USAGE_ERROR)
        args.file = args.files[0] if args.files else None
        return live.execute(args)
    if not args.files:
        raise common.CommandError("a snapshot FILE (or --pid PID) is required", common.USAGE_ERROR)
    return execute(args)


def _statistics(snapshot, args: argparse.Namespace, path: str):
    """Filter, group and total a snapshot: (filtered snapshot, statistics, size, count)."""
    snapshot = common.filtered(snapshot, args, path)
    with common.Progress("computing statistics"):
        stats = snapshot.statistics(args.key, cumulative=args.cumulative)
        total_size, total_count = common.totals(snapshot)
    return snapshot, stats, total_size, total_count


def render_stats(path: str, snapshot, args: argparse.Namespace, stream) -> list[str]:
    """The text of ``alloctrace stats`` for an already loaded snapshot."""
    memory = _report.process_memory_note(common.traced(snapshot), snapshot)
    snapshot, stats, total_size, total_count = _statistics(snapshot, args, path)
    limit = common.limit(args)
    shown = stats if limit is None else stats[:limit]
    renderer = common.renderer(common.names(shown), args, stream)
    shown_count = len(stats) if limit is None else min(limit, len(stats))
    names = _report.KEY_SINGULAR if shown_count == 1 else _report.KEY_TITLES
    what = names[args.key] + (" (cumulative)" if args.cumulative else "")
    count = "All" if limit is None else f"Top {shown_count}"
    where = "at the peak of" if getattr(snapshot, "is_peak", False) else "in"
    title = f"{count} {what} {where} {common.header(path, snapshot, memory)}"
    lines = renderer.stats(
        stats,
        key_type=args.key,
        cumulative=args.cumulative,
        limit=limit,
        total_size=total_size,
        total_count=total_count,
        title=title,
    )
    note = _report.sampling_note(snapshot)
    if note is not None:
        # A line of its own under the title, so a narrow terminal cannot cut it off.
        lines.insert(1, f"({note})")
    return lines


def execute(args: argparse.Namespace) -> int:
    from . import _tree

    if _tree.is_many(args.files):
        return _tree.execute_stats(args)
    args.file = args.files[0]
    common.check_key(args)
    snapshot = common.load(args.file, args.allow_pickle)
    if getattr(args, "peak", False):
        snapshot = common.peak_of(args.file, snapshot)
    common.check_objects(args.file, snapshot, args)
    if args.json:
        _, described = common.filters(args)
        memory = _report.process_memory_json(common.traced(snapshot), snapshot)
        snapshot, stats, total_size, total_count = _statistics(snapshot, args, args.file)
        document = _report.stats_json(
            stats,
            path=args.file,
            snapshot=snapshot,
            key_type=args.key,
            cumulative=args.cumulative,
            limit=common.limit(args),
            filters=described,
            total_size=total_size,
            total_count=total_count,
        )
        # Null for snapshots that did not record it (loaded pickles, older files).
        document["snapshot"]["process_memory"] = memory
        common.write_json(document)
        return 0
    common.write_lines(render_stats(args.file, snapshot, args, sys.stdout))
    return 0
