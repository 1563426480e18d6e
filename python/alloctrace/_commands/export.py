"""``alloctrace export``: a snapshot as a pprof profile or as folded stacks."""

from __future__ import annotations

import argparse

from . import _common as common

EXPORT_FORMATS = ("pprof", "collapsed")


def register(commands) -> None:
    export = commands.add_parser(
        "export", help="write a snapshot as a pprof profile or as folded stacks"
    )
    export.add_argument("file", help="snapshot file")
    export.add_argument(
        "--format",
        required=True,
        choices=EXPORT_FORMATS,
        help="pprof: gzipped profile.proto (go tool pprof); collapsed: 'a;b;c bytes' lines",
    )
    common.add_export_options(export)
    export.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    snapshot = common.loaded_and_filtered(args.file, args)
    if args.format == "pprof":
        common.write_export(args.output, snapshot.to_pprof)
    else:
        common.write_export(args.output, snapshot.to_collapsed)
    return 0
