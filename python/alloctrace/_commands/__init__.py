"""The ``alloctrace`` command line (also ``python -m alloctrace``): one module per subcommand
behind this dispatch.

``run`` traces a program from its first line and summarises the snapshot it leaves at exit;
``stats``/``top`` and ``diff`` read snapshot files written by :meth:`Snapshot.dump`, by
``ALLOCTRACE_DUMP`` or by ``run``; ``export`` and ``flamegraph`` turn them into pprof
profiles, folded stacks and SVG flamegraphs; ``why`` shows retention reports; ``report`` writes
one HTML page of a series of snapshots; ``snapshot`` asks a running process for one
(``ALLOCTRACE_SIGNAL``); ``top --interval`` follows a running process's dumps live. Text goes to
people, ``--json`` to programs (rendering lives in ``_report``). Every failure is one line on
stderr and a non-zero status, never a traceback: this is a tool people point at files they are
unsure about.

A subcommand is a module with ``register(commands)``, which adds its parser to the
subcommands and sets ``handler`` (called with the parsed arguments, returning the exit status).
A subcommand that reads its own command line (``run``) is also listed in
:data:`OWN_COMMAND_LINE`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from . import diff, export, flamegraph, report, run, snapshot, stats, why
from ._common import FAILURE, PROG, USAGE_ERROR, CommandError, Parser

#: In the order ``--help`` lists them.
COMMANDS = (run, stats, diff, export, flamegraph, why, report, snapshot)

#: Subcommands handed the rest of the command line as it is, before argparse sees it.
OWN_COMMAND_LINE = {"run": run.main}


def build_parser() -> Parser:
    parser = Parser(
        prog=PROG,
        description="Trace Python memory allocations and read the snapshots.",
        epilog="Start-up variables (for the programs you trace; the alloctrace command "
        "itself is never traced): ALLOCTRACE=NFRAME, ALLOCTRACE_DUMP=PATH, "
        "ALLOCTRACE_INTERVAL=SECONDS, ALLOCTRACE_SAMPLE_INTERVAL=BYTES, "
        "ALLOCTRACE_SAMPLE_SEED=N, ALLOCTRACE_OBJECTS=1, ALLOCTRACE_RETENTION=N, "
        "ALLOCTRACE_SIGNAL=SIGNAME, ALLOCTRACE_CAPTURE=DIR (see docs/startup.md).",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {_version()}", help="show the version"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for module in COMMANDS:
        module.register(commands)
    return parser


def _version() -> str:
    import alloctrace

    return alloctrace.__version__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``alloctrace`` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in OWN_COMMAND_LINE:
            return OWN_COMMAND_LINE[argv[0]](argv[1:])
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            raise CommandError(
                "a command is required: run, stats, top, diff, export, flamegraph, why, report "
                "or snapshot",
                USAGE_ERROR,
            )
        return args.handler(args)
    except CommandError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return exc.status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader (head, less) went away: stop quietly, as a filter should.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return FAILURE
    except Exception as exc:
        sys.stderr.write(f"{PROG}: error: {type(exc).__name__}: {exc}\n")
        return FAILURE
