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
    common.add_process_arguments(snapshot, "the file")
    snapshot.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    from .. import _ondemand

    try:
        path = _ondemand.request_snapshot(args.pid, timeout=args.timeout)
    except _ondemand.RequestError as exc:
        raise common.CommandError(str(exc)) from None
    common.write_lines([path])
    return 0
