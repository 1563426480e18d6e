"""``alloctrace why``: why the objects of a line are alive, from the retention reports a
snapshot captured (``take_snapshot(retention=N)`` or ``ALLOCTRACE_OBJECTS=1`` dumps)."""

from __future__ import annotations

import argparse
import re

from .. import _report
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
    why.add_argument(
        "file",
        help="snapshot file with retention reports, or a capture directory or quoted glob "
        "(the reports of each process that has one)",
    )
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
        help="show file names in full (default: shortened as stats shortens them)",
    )
    common.add_pickle_option(why)
    why.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    from . import _tree

    if _tree.is_many([args.file]):
        return _execute_many(args)
    snapshot = common.load(args.file, args.allow_pickle)
    sites = _sites(args.file, snapshot, args)
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
        common.write_lines(_text(sites, args).split("\n"))
    return 0


def _execute_many(args: argparse.Namespace) -> int:
    """``why`` over several snapshots: the reports of each process, one after the other."""
    from . import _tree

    sources, notes = _tree.resolve([args.file])
    found = []
    for source in sources:
        snapshot = common.load(source.path, args.allow_pickle)
        if snapshot._data.retention is None:
            continue
        try:
            sites = _sites(source.path, snapshot, args)
        except common.CommandError:
            if args.line is None:
                raise
            continue
        found.append((source, sites))
    if not found:
        what = "retention reports" if args.line is None else f"a retention report for {args.line}"
        raise common.CommandError(
            f"no snapshot of {args.file} holds {what}: capture them with 'alloctrace run "
            "--objects PROGRAM' (or ALLOCTRACE_OBJECTS=1)"
        )
    if args.json:
        common.write_json(
            {
                "version": JSON_VERSION,
                "command": "why",
                "file": args.file,
                "processes": [
                    {
                        "file": source.path,
                        "pid": None if source.process is None else source.process.pid,
                        "reports": [site._json() for site in sites],
                    }
                    for source, sites in found
                ],
            }
        )
        return 0
    blocks = [f"== {source.label} ==\n{_text(sites, args)}" for source, sites in found]
    common.write_lines("\n\n".join(blocks).split("\n"))
    return 0


#: A location in a report's text: an absolute file name and a line number.
_LOCATION = re.compile(r"(/[^\s():]+):(\d+)")


def _text(sites, args: argparse.Namespace) -> str:
    text = "\n\n".join(str(site) for site in sites)
    if args.full_paths:
        return text
    # As stats and diff shorten them: relative to the current directory, site-packages or the
    # standard library, unless two files would then read the same.
    shorten = _report.PathShortener({m.group(1) for m in _LOCATION.finditer(text)})
    return _LOCATION.sub(lambda m: f"{shorten(m.group(1))}:{m.group(2)}", text)


def _sites(path: str, snapshot, args: argparse.Namespace) -> list:
    """The retention reports of *snapshot* that ``--line`` chooses (all without it)."""
    reports = snapshot._data.retention
    if reports is None:
        raise common.CommandError(
            f"{path} holds no retention reports: capture them with "
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
            raise common.CommandError(f"{path}: {error}", common.USAGE_ERROR) from None
        chosen = [] if found is None else [found]
        if not chosen:
            captured = ", ".join(f"{r['filename']}:{r['lineno']}" for r in reports) or "none"
            raise common.CommandError(
                f"{path} has no retention report for {args.line} (captured for: {captured})"
            )
    sites = [SiteRetention(r) for r in chosen]
    for site in sites:
        if args.limit is not None:
            site.paths = site.paths[: args.limit]
    return sites
