"""``alloctrace top --interval SECONDS PATTERN`` and ``alloctrace top --pid PID``: the live view of
a running process's dumps, or of the snapshots it is asked for (the screen is drawn by
:mod:`alloctrace._live`)."""

from __future__ import annotations

import argparse
import os
import sys

from .. import _startup
from . import _common as common


def add_options(top: argparse.ArgumentParser) -> None:
    top.add_argument(
        "--interval",
        metavar="SECONDS",
        help="keep looking for the newest file matching FILE every SECONDS and redraw its top "
        "lines with their growth since the dump before it, until Ctrl-C; FILE a capture "
        "directory: the newest snapshot of each of its processes, summed per line",
    )
    top.add_argument(
        "--pid",
        type=int,
        metavar="PID",
        help="instead of FILE, ask process PID for a snapshot every --interval SECONDS "
        f"(default: {DEFAULT_PID_INTERVAL:g}), as 'alloctrace snapshot PID' does, and redraw",
    )


#: How often ``top --pid`` asks when no ``--interval`` is given, in seconds.
DEFAULT_PID_INTERVAL = 5.0


def execute(args: argparse.Namespace) -> int:
    from .. import _live

    if args.pid is not None and args.file is not None:
        raise common.CommandError("give either FILE or --pid PID, not both", common.USAGE_ERROR)
    if args.pid is None and args.file is None:
        raise common.CommandError(
            "a FILE pattern (or --pid PID) is required with --interval", common.USAGE_ERROR
        )
    if args.interval is None:
        args.interval = str(DEFAULT_PID_INTERVAL)
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

    view = {
        "limit": common.limit(args),
        "source": not args.no_source,
        "full_paths": args.full_paths,
        "load": load,
        # Re-read at each redraw: the terminal may be resized while the view runs.
        "width": lambda: common._width(sys.stdout),
    }
    try:
        if args.pid is not None:
            _live.run_pid(args.pid, interval, sys.stdout, request=_requester(interval), **view)
            return 0
        from .._capture import is_capture

        if is_capture(args.file):
            _live.run_capture(args.file, interval, sys.stdout, **view)
            return 0
        _live.run(args.file, interval, sys.stdout, **view)
    except KeyboardInterrupt:
        # Ctrl-C is how the live view ends: not a failure.
        sys.stdout.write("\n")
    return 0


def _requester(interval: float):
    from .. import _ondemand

    def request(pid: int) -> str:
        try:
            # A snapshot of a big process may take longer than the interval: wait for it.
            return _ondemand.request_snapshot(pid, timeout=max(30.0, interval))
        except _ondemand.NotSetUp as exc:
            # Asking again would not help: say so once and end.
            raise common.CommandError(str(exc)) from None
        except _ondemand.RequestError as exc:
            if not os.path.exists(f"/proc/{pid}"):
                raise common.CommandError(f"process {pid} has ended") from None
            raise ValueError(str(exc)) from None

    return request
