"""``alloctrace flamegraph``: live memory by stack as an SVG, or its growth between two
snapshots."""

from __future__ import annotations

import argparse

from . import _common as common


def register(commands) -> None:
    flamegraph = commands.add_parser(
        "flamegraph",
        help="draw live memory by stack as an SVG flamegraph, or its growth",
        description="Draw the live memory of a snapshot file by stack as an interactive SVG "
        "flamegraph, or (--diff) what grew from OLD to NEW.",
    )
    flamegraph.add_argument(
        "file", nargs="?", help="snapshot file, or a capture directory or quoted glob (merged)"
    )
    flamegraph.add_argument(
        "--diff",
        nargs=2,
        metavar=("OLD", "NEW"),
        help="draw what grew from OLD to NEW instead (red grew, blue shrank)",
    )
    flamegraph.add_argument("--title", help="title at the top of the picture")
    common.add_export_options(flamegraph)
    flamegraph.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    if (args.file is None) == (args.diff is None):
        raise common.CommandError(
            "give either one snapshot FILE or --diff OLD NEW (see 'alloctrace flamegraph --help')",
            common.USAGE_ERROR,
        )
    if args.diff is None:
        snapshot, base = common.loaded_and_filtered(args.file, args, strict=True), None
    else:
        base = common.loaded_and_filtered(args.diff[0], args)
        snapshot = common.loaded_and_filtered(args.diff[1], args, strict=True)
    if args.diff is None:
        output = common.output_or_default(args, args.file, ".svg")
    else:
        output = common.output_or_default(args, args.diff[1], "-diff.svg")
    common.write_export(
        output, lambda output: snapshot.to_flamegraph(output, title=args.title, base=base)
    )
    return 0
