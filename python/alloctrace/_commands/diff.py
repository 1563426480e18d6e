"""``alloctrace diff OLD NEW``: what grew and shrank between two snapshots; ``alloctrace diff
--peak FILE``: between the peak stored in a dump and the dump's own snapshot."""

from __future__ import annotations

import argparse
import sys

from .. import _report
from . import _common as common


def register(commands) -> None:
    diff = commands.add_parser(
        "diff",
        help="what grew and shrank between two snapshots",
        description="What grew and shrank from OLD to NEW, biggest change first (unchanged "
        "entries left out).",
    )
    diff.add_argument(
        "old", help="earlier snapshot file, capture directory or quoted glob (summed per site)"
    )
    diff.add_argument("new", nargs="?", help="later snapshot file, capture directory or glob")
    diff.add_argument(
        "--peak",
        action="store_true",
        help="compare the one snapshot file given to the peak stored in it (peak -> end)",
    )
    diff.add_argument(
        "--by-process",
        action="store_true",
        help="two captures: one comparison per process, processes matched by their role "
        "(command line and place in the tree, not pid)",
    )
    common.add_report_options(diff)
    diff.set_defaults(handler=execute)


def _warn_if_swapped(args: argparse.Namespace, old, new) -> None:
    """A warning when OLD was taken after NEW (by their metadata): growth would read as loss."""
    old_time = (getattr(old, "metadata", None) or {}).get("timestamp")
    new_time = (getattr(new, "metadata", None) or {}).get("timestamp")
    if old_time is None or new_time is None or old_time <= new_time:
        return
    sys.stderr.write(
        f"{common.PROG}: warning: OLD ({args.old}, taken {common.format_time(old_time)}) is newer "
        f"than NEW ({args.new}, taken {common.format_time(new_time)}): the changes shown are "
        f"NEW minus OLD; swap the files to see what grew since {args.new}\n"
    )
    sys.stderr.flush()


def changes(every, new: tuple[int, int], old: tuple[int, int]) -> tuple[list, dict]:
    """The entries of a comparison that changed, and the totals of ``diff``'s output from
    the ``(size, count)`` totals of the *new* and *old* sides."""
    # Unchanged entries tell nothing about growth; compare_to sorts them last anyway.
    diffs = [stat for stat in every if stat.size_diff or stat.count_diff]
    total = {
        "size": new[0],
        "size_diff": new[0] - old[0],
        "count": new[1],
        "count_diff": new[1] - old[1],
    }
    return diffs, total


def execute(args: argparse.Namespace) -> int:
    common.check_key(args)
    if args.peak:
        if args.by_process:
            raise common.CommandError(
                "diff --peak compares one snapshot file to its peak: not with --by-process",
                common.USAGE_ERROR,
            )
        if args.new is not None:
            raise common.CommandError(
                "diff --peak takes one snapshot file (its peak is compared to it)",
                common.USAGE_ERROR,
            )
        new = common.load(args.old, args.allow_pickle)
        old = common.peak_of(args.old, new)
        args.new, args.old = args.old, f"{args.old} (peak)"
    elif args.new is None:
        raise common.CommandError(
            "diff needs two snapshot files (or --peak and one)", common.USAGE_ERROR
        )
    else:
        from . import _tree

        if _tree.is_many([args.old]) or _tree.is_many([args.new]) or args.by_process:
            return _tree.execute_diff(args)
        old = common.load(args.old, args.allow_pickle)
        new = common.load(args.new, args.allow_pickle)
    common.check_objects(args.old, old, args)
    common.check_objects(args.new, new, args)
    _warn_if_swapped(args, old, new)
    _, described = common.filters(args)
    # Whole totals, before the filters: the RSS is the whole process's.
    rss = _report.rss_change((common.traced(old), old), (common.traced(new), new))
    old = common.filtered(old, args, args.old)
    new = common.filtered(new, args, args.new)
    with common.Progress("comparing snapshots"):
        every = new.compare_to(old, args.key, cumulative=args.cumulative)
        diffs, total = changes(every, common.totals(new), common.totals(old))
    limit = common.limit(args)
    if args.json:
        document = _report.diff_json(
            diffs,
            old=(args.old, old),
            new=(args.new, new),
            key_type=args.key,
            cumulative=args.cumulative,
            limit=limit,
            filters=described,
            total=total,
        )
        # Null unless both snapshots recorded the process's memory.
        document["rss"] = rss
        common.write_json(document)
        return 0
    lines = rendered(
        diffs,
        total,
        args,
        sys.stdout,
        lambda heading: f"{heading}: {args.new} compared to {args.old}",
    )
    notes = [
        f"({name}: {note})"
        for name, snapshot in ((args.new, new), (args.old, old))
        if (note := _report.sampling_note(snapshot)) is not None
    ]
    if rss is not None:
        notes[0:0] = _report.rss_change_lines(rss, common._width(sys.stdout))
    lines[1:1] = notes
    common.write_lines(lines)
    return 0


def rendered(diffs, total, args: argparse.Namespace, stream, title) -> list[str]:
    """The text of *diffs* as ``diff`` prints them; *title* makes the heading from its start
    (``"Top 3 differences by line"``)."""
    limit = common.limit(args)
    shown = diffs if limit is None else diffs[:limit]
    what = _report.KEY_SINGULAR[args.key] + (" (cumulative)" if args.cumulative else "")
    count = "All" if limit is None else f"Top {len(shown)}"
    noun = "difference" if len(shown) == 1 else "differences"
    return common.renderer(common.names(shown), args, stream).diff(
        diffs,
        key_type=args.key,
        cumulative=args.cumulative,
        limit=limit,
        total=total,
        title=title(f"{count} {noun} by {what}"),
    )
