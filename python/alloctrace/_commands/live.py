"""``alloctrace top --interval SECONDS PATTERN``: the live view of a running process's dumps
(the screen is drawn by :mod:`alloctrace._live`)."""

from __future__ import annotations

import argparse
import sys

from .. import _startup
from . import _common as common


def add_options(top: argparse.ArgumentParser) -> None:
    top.add_argument(
        "--interval",
        metavar="SECONDS",
        help="keep looking for the newest file matching FILE every SECONDS and redraw its top "
        "lines with their growth since the dump before it, until Ctrl-C",
    )


def execute(args: argparse.Namespace) -> int:
    from .. import _live

    try:
        interval = _startup.parse_interval(args.interval)
    except _startup.ConfigError:
        raise common.CommandError(
            f"argument --interval: expected a number of seconds greater than 0, not "
            f"{args.interval!r}",
            common.USAGE_ERROR,
        ) from None

    def load(path: str):
        try:
            return common.load(path, args.allow_pickle)
        except common.CommandError as exc:
            raise ValueError(str(exc)) from None

    try:
        _live.run(
            args.file,
            interval,
            sys.stdout,
            limit=common.limit(args),
            source=not args.no_source,
            full_paths=args.full_paths,
            load=load,
            # Re-read at each redraw: the terminal may be resized while the view runs.
            width=lambda: common._width(sys.stdout),
        )
    except KeyboardInterrupt:
        # Ctrl-C is how the live view ends: not a failure.
        sys.stdout.write("\n")
    return 0
