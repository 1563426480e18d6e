"""``alloctrace why``: why the objects of a line are alive, from the retention reports a
snapshot captured (``take_snapshot(retention=N)`` or ``ALLOCTRACE_OBJECTS=1`` dumps)."""

from __future__ import annotations

import argparse
import os

from . import _common as common

#: As for stats and diff: changes only if a field changes meaning or disappears.
JSON_VERSION = 1


def register(commands) -> None:
    why = commands.add_parser(
        "why",
        help="why the objects of a line are alive (retention report captured in a dump)",
        description="Why the objects allocated at a line are alive: what holds them, sample "
        "reference chains and retained sizes, from the retention reports a snapshot file holds.",
    )
    why.add_argument("file", help="snapshot file with retention reports")
    why.add_argument(
        "--line",
        metavar="FILE:LINE",
        help="the allocation site (FILE may be the end of the path); default: every report",
    )
    why.add_argument(
        "--limit",
        type=common.positive_int,
        metavar="N",
        help="show at most N sample paths per site (default: every path the report holds)",
    )
    why.add_argument("--json", action="store_true", help="write the reports as JSON")
    why.add_argument(
        "--full-paths",
        action="store_true",
        help="show file names in full (default: relative to the current directory)",
    )
    common.add_pickle_option(why)
    why.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    snapshot = common.load(args.file, args.allow_pickle)
    reports = snapshot._data.retention
    if reports is None:
        raise common.CommandError(
            f"{args.file} holds no retention reports: capture them with "
            "'alloctrace run --objects PROGRAM', ALLOCTRACE_OBJECTS=1 next to ALLOCTRACE_DUMP, "
            "or take_snapshot(retention=N) before dump() in code"
        )
    from alloctrace._snapshot import SiteRetention, find_site_report

    if args.line is None:
        chosen = list(reports)
    else:
        filename, sep, line = args.line.rpartition(":")
        if not sep or not filename or not line.isdigit():
            raise common.CommandError(
                f"--line expects FILE:LINE (like app.py:42), not {args.line!r}", common.USAGE_ERROR
            )
        try:
            found = find_site_report(reports, filename, int(line))
        except ValueError as error:
            raise common.CommandError(f"{args.file}: {error}", common.USAGE_ERROR) from None
        chosen = [] if found is None else [found]
        if not chosen:
            captured = ", ".join(f"{r['filename']}:{r['lineno']}" for r in reports) or "none"
            raise common.CommandError(
                f"{args.file} has no retention report for {args.line} (captured for: {captured})"
            )
    sites = [SiteRetention(r) for r in chosen]
    for site in sites:
        if args.limit is not None:
            site.paths = site.paths[: args.limit]
    if args.json:
        common.write_json(
            {
                "version": JSON_VERSION,
                "command": "why",
                "file": args.file,
                "reports": [site._json() for site in sites],
            }
        )
    else:
        text = "\n\n".join(str(site) for site in sites)
        if not args.full_paths:
            # As stats and diff do: files under the current directory, relative to it.
            text = text.replace(os.getcwd().rstrip("/") + "/", "")
        common.write_lines(text.split("\n"))
    return 0
