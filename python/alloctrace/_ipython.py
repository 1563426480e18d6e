"""The ``%%alloctrace`` cell magic for IPython and Jupyter (``%load_ext alloctrace``).

``%%alloctrace`` at the top of a cell traces the cell alone: tracing starts before its first
line and stops after its last, so what is reported is what the cell allocated. It prints the
cell's peak (the highest traced memory while it ran) with the top lines of what was alive at
that moment, then the top lines of what it allocated that is still alive when it ends, and
returns the :class:`~alloctrace.Snapshot` of the end (so ``_``/``Out[n]`` hold it for more
analysis; ``.peak`` holds the peak snapshot). Options::

    %%alloctrace [-n N] [--frames N] [--flamegraph] [--key lineno|filename|traceback]

A cell that raises reports nothing: the exception propagates as without the magic.
``-n N``: how many lines to print (default 10). ``--frames N``: frames kept per traceback
(default 16). ``--flamegraph``: also show the flamegraph of what is alive at the end, inline.
"""

from __future__ import annotations

import argparse
import os
import shlex
import tempfile

from alloctrace import _native
from alloctrace._report import format_size
from alloctrace._snapshot import Filter

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _UsageError(f"%%alloctrace: {message}")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="%%alloctrace", add_help=False)
    parser.add_argument("-n", type=int, default=10, dest="limit")
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--flamegraph", action="store_true")
    parser.add_argument("--key", choices=("lineno", "filename", "traceback"), default="lineno")
    return parser


def alloctrace_cell(shell, line: str, cell: str):
    """Run *cell* in *shell* traced, print its peak and top lines, return its snapshot."""
    from IPython.core.error import UsageError

    import alloctrace

    try:
        args = _parser().parse_args(shlex.split(line))
    except _UsageError as error:
        raise UsageError(str(error)) from None
    if args.limit < 0 or not 1 <= args.frames <= 65535:
        raise UsageError("%%alloctrace: -n must be >= 0 and --frames from 1 to 65535")
    if _native.is_tracing():
        raise UsageError(
            "%%alloctrace: alloctrace is already tracing (started elsewhere): call "
            "alloctrace.stop() first, or take a snapshot of that tracing instead"
        )
    # As %%time does: the cell's IPython syntax transformed, its source cached for
    # tracebacks and for the source lines of the report, run in the user's namespace.
    source = shell.transform_cell(cell)
    filename = shell.compile.cache(source, shell.execution_count)
    code = shell.compile(source, filename, "exec")
    _native.start(args.frames)
    try:
        exec(code, shell.user_ns)
        peak = _native.get_traced_memory()[1]
        if not _native.is_tracing():
            print("%%alloctrace: the cell stopped tracing itself; nothing to report")
            return None
        snapshot = alloctrace.take_snapshot()
        at_peak = alloctrace.take_snapshot(peak=True)
    finally:
        if _native.is_tracing():
            _native.stop()
    ours = [Filter(False, os.path.join(_PACKAGE_DIR, "*"))]
    snapshot = snapshot.filter_traces(ours)
    at_peak = at_peak.filter_traces(ours)
    stats = snapshot.statistics(args.key)
    alive = sum(s.size for s in stats)
    print(
        f"%%alloctrace: peak {format_size(peak)}, "
        f"{format_size(alive)} still alive at the end of the cell"
    )
    for title, shown in (
        ("at the peak", at_peak.statistics(args.key)),
        ("still alive", stats),
    ):
        if shown and args.limit:
            print(f"top {min(args.limit, len(shown))} lines {title}:")
            for stat in shown[: args.limit]:
                print(f"  {stat}")
    snapshot = snapshot._with_peak(at_peak)
    if args.flamegraph:
        _show_flamegraph(snapshot)
    return snapshot


def _show_flamegraph(snapshot) -> None:
    from IPython.display import SVG, display

    fd, path = tempfile.mkstemp(suffix=".svg", prefix="alloctrace-")
    os.close(fd)
    try:
        snapshot.to_flamegraph(path, title="alive at the end of the cell")
        with open(path, encoding="utf-8") as f:
            display(SVG(data=f.read()))
    finally:
        os.unlink(path)


def load_ipython_extension(shell) -> None:
    """Register ``%%alloctrace`` (called by ``%load_ext alloctrace``)."""

    def magic(line, cell):
        return alloctrace_cell(shell, line, cell)

    magic.__doc__ = __doc__
    shell.register_magic_function(magic, magic_kind="cell", magic_name="alloctrace")
