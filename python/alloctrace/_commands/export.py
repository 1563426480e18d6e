"""``alloctrace export``: a snapshot as a pprof profile or as folded stacks."""

from __future__ import annotations

import argparse

from . import _common as common

#: "folded" and "collapsed" are two names of one format (flamegraph.pl's stackcollapse output).
EXPORT_FORMATS = ("pprof", "folded", "collapsed")


def register(commands) -> None:
    export = commands.add_parser(
        "export",
        help="write a snapshot as a pprof profile or as folded stacks",
        description="Write the live memory of a snapshot file by stack, as a pprof heap profile "
        "or as folded stacks.",
    )
    export.add_argument(
        "file", help="snapshot file, or a capture directory or quoted glob (merged)"
    )
    export.add_argument(
        "--format",
        required=True,
        choices=EXPORT_FORMATS,
        help="pprof: gzipped profile.proto (go tool pprof); folded (or collapsed): "
        "'a;b;c bytes' lines, for flamegraph.pl, inferno, speedscope",
    )
    common.add_export_options(export)
    export.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    snapshot = common.loaded_and_filtered(args.file, args)
    ending = ".pb.gz" if args.format == "pprof" else ".folded"
    output = common.output_or_default(args, args.file, ending)
    if args.format == "pprof":
        common.write_export(output, snapshot.to_pprof)
    else:
        common.write_export(output, snapshot.to_collapsed)
    return 0
