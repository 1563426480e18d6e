"""The ``%alloctrace`` line magic and ``%%alloctrace`` cell magic for IPython and Jupyter
(``%load_ext alloctrace``).

``%%alloctrace`` at the top of a cell traces the cell alone, and ``%alloctrace STATEMENT``
traces one statement (as ``%time`` times one): tracing starts before it and stops after it, so
what is reported is what it allocated. It prints the peak (the highest traced memory while it
ran) with the top lines of what was alive at that moment, then the top lines of what it
allocated that is still alive when it ends, and returns the :class:`~alloctrace.Snapshot` of the
end (so ``_``/``Out[n]`` hold it for more analysis; ``.peak`` holds the peak snapshot).
Options, before the statement of the line magic::

    %%alloctrace [-n NFRAME] [--limit N] [--flamegraph] [--key lineno|filename|traceback]
    %alloctrace [options] STATEMENT

Code that raises reports nothing: the exception propagates as without the magic.
``-n NFRAME`` (or ``--frames``): frames kept per traceback (default 16), as ``-n`` of
``alloctrace run`` and ``nframe`` of ``start()``. ``--limit N``: how many lines to print
(default 10). ``--flamegraph``: also show the flamegraph of what is alive at the end, inline.
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
        raise _UsageError(f"{self.prog}: {message}")


#: Options that take a value, for finding where the line magic's statement begins.
_VALUE_OPTIONS = ("-n", "--frames", "--limit", "--key")


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, add_help=False)
    parser.add_argument("-n", "--frames", type=int, default=16, dest="frames")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--flamegraph", action="store_true")
    parser.add_argument("--key", choices=("lineno", "filename", "traceback"), default="lineno")
    return parser


def _split_line(line: str) -> tuple[list[str], str]:
    """The line magic's options and its statement: the options are the leading words that
    start with ``-`` (with the value of those that take one), the statement is the rest, as it
    was typed."""
    options: list[str] = []
    rest = line.strip()
    while rest.startswith("-"):
        word, _, rest = rest.partition(" ")
        rest = rest.lstrip()
        options.append(word)
        if word in _VALUE_OPTIONS and rest:
            value, _, rest = rest.partition(" ")
            rest = rest.lstrip()
            options.append(value)
    return options, rest


def _arguments(prog: str, words: list[str]):
    from IPython.core.error import UsageError

    try:
        args = _parser(prog).parse_args(words)
    except _UsageError as error:
        raise UsageError(str(error)) from None
    if args.limit < 0 or not 1 <= args.frames <= 65535:
        raise UsageError(f"{prog}: --limit must be >= 0 and -n/--frames from 1 to 65535")
    if _native.is_tracing():
        raise UsageError(
            f"{prog}: alloctrace is already tracing (started elsewhere): call "
            "alloctrace.stop() first, or take a snapshot of that tracing instead"
        )
    return args


def alloctrace_line(shell, line: str):
    """Run the statement of *line* in *shell* traced, print its peak and top lines, return its
    snapshot."""
    from IPython.core.error import UsageError

    words, statement = _split_line(line)
    args = _arguments("%alloctrace", words)
    if not statement:
        raise UsageError("%alloctrace: a statement to trace is required, e.g. %alloctrace x = f()")
    return _trace(shell, args, statement, "%alloctrace", "statement")


def alloctrace_cell(shell, line: str, cell: str):
    """Run *cell* in *shell* traced, print its peak and top lines, return its snapshot."""
    args = _arguments("%%alloctrace", shlex.split(line))
    return _trace(shell, args, cell, "%%alloctrace", "cell")


def _trace(shell, args, text: str, prog: str, what: str):
    import alloctrace

    # As %%time does: the IPython syntax transformed, the source cached for tracebacks and for
    # the source lines of the report, run in the user's namespace.
    source = shell.transform_cell(text)
    filename = shell.compile.cache(source, shell.execution_count)
    code = shell.compile(source, filename, "exec")
    _native.start(args.frames)
    try:
        exec(code, shell.user_ns)
        peak = _native.get_traced_memory()[1]
        if not _native.is_tracing():
            print(f"{prog}: the {what} stopped tracing itself; nothing to report")
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
        f"{prog}: peak {format_size(peak)}, "
        f"{format_size(alive)} still alive at the end of the {what}"
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
        _show_flamegraph(snapshot, what)
    return snapshot


def _show_flamegraph(snapshot, what: str) -> None:
    from IPython.display import SVG, display

    fd, path = tempfile.mkstemp(suffix=".svg", prefix="alloctrace-")
    os.close(fd)
    try:
        snapshot.to_flamegraph(path, title=f"alive at the end of the {what}")
        with open(path, encoding="utf-8") as f:
            display(SVG(data=f.read()))
    finally:
        os.unlink(path)


def load_ipython_extension(shell) -> None:
    """Register ``%alloctrace`` and ``%%alloctrace`` (called by ``%load_ext alloctrace``)."""

    def magic(line, cell=None):
        if cell is None:
            return alloctrace_line(shell, line)
        return alloctrace_cell(shell, line, cell)

    magic.__doc__ = __doc__
    shell.register_magic_function(magic, magic_kind="line_cell", magic_name="alloctrace")
