"""``alloctrace report``: one self-contained HTML page of one or more snapshots of a process,
or of a whole process-tree capture (the page itself is made by :mod:`alloctrace._html_report`)."""

from __future__ import annotations

import argparse
import os

from . import _common as common


def register(commands) -> None:
    report = commands.add_parser(
        "report",
        help="write a self-contained HTML report of one or more snapshots",
        description="Write one HTML page, with no outside resources, of one snapshot or a series "
        "of them (e.g. the files of ALLOCTRACE_INTERVAL): memory over time, the top lines and "
        "what changed, the peak, object kinds and retention paths where recorded, and a "
        "flamegraph. Open it in any browser.",
    )
    report.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="snapshot files of one process, e.g. an ALLOCTRACE_INTERVAL series (any order); "
        "a directory stands for its *.snap files, a quoted pattern for its matches; a capture "
        "directory (of 'alloctrace run') gives the page of its process tree",
    )
    report.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="HTML file to write ('-': stdout; default: the first file's name with .html, in "
        "the current directory)",
    )
    report.add_argument("--title", help="title of the page (default: from the program's name)")
    common.add_source_from_option(report)
    common.add_pickle_option(report)
    report.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    from .. import _html_report, _output
    from ._tree import files_of

    if not args.files:
        raise common.CommandError(
            "no snapshot files given (see 'alloctrace report --help')", common.USAGE_ERROR
        )
    from .._capture import is_capture

    captures = [path for path in args.files if is_capture(path)]
    if captures and len(args.files) > 1:
        raise common.CommandError(
            f"{captures[0]} is a process-tree capture: report it alone (one page per capture)",
            common.USAGE_ERROR,
        )
    files = [] if captures else [name for path in args.files for name in files_of(path)]
    args.output = common.output_or_default(args, args.files[0], ".html")
    try:
        with common.Progress(f"writing {args.output}"):
            if captures:
                _html_report.write_capture_report(
                    captures[0], args.output, title=args.title, allow_pickle=args.allow_pickle
                )
            else:
                _html_report.write_report(
                    files, args.output, title=args.title, allow_pickle=args.allow_pickle
                )
    except (_html_report.ReportError, _output.OutputError) as exc:
        raise common.CommandError(str(exc)) from None
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise common.CommandError(f"cannot write {args.output}: {reason}") from None
    return 0
