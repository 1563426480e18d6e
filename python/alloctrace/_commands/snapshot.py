"""``alloctrace snapshot PID``: ask a running process started with ``ALLOCTRACE_SIGNAL`` (or
``run --signal``, or traced by ``alloctrace attach``) for a snapshot and print the file's path
(see :mod:`alloctrace._ondemand`)."""

from __future__ import annotations

import argparse

from . import _common as common


def register(commands) -> None:
    snapshot = commands.add_parser(
        "snapshot",
        help="ask a running process for a snapshot (started with ALLOCTRACE_SIGNAL or 'run "
        "--signal', or attached to); print its path",
        description="Ask a running process for a snapshot now, and print the file's path once it "
        "is written. The process must have been started with ALLOCTRACE_SIGNAL=SIGNAME (and "
        "ALLOCTRACE_DUMP, which names the files) or under 'alloctrace run --signal', or be "
        "traced by 'alloctrace attach'; it writes the snapshot between two lines of its Python "
        "code and goes on running.",
    )
    snapshot.add_argument("pid", type=int, help="the process id")
    snapshot.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for the file (default: 30)",
    )
    snapshot.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    from .. import _ondemand

    if not args.timeout > 0:
        raise common.CommandError(
            f"--timeout must be more than 0, not {args.timeout:g}", common.USAGE_ERROR
        )
    try:
        path = _ondemand.request_snapshot(args.pid, timeout=args.timeout)
    except _ondemand.RequestError as exc:
        raise common.CommandError(str(exc)) from None
    common.write_lines([path])
    return 0
