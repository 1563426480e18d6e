"""``alloctrace run``: run a program traced from its first line, then summarise the snapshot it
leaves at exit.

``run`` reads its own command line (:func:`main`): everything from the program on belongs to the
program, untouched, as with ``python`` itself.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

from .. import _startup
from .._signals import set_handler
from . import _common as common
from . import _tree
from ._common import PROG, CommandError
from .stats import render_stats


def register(commands) -> None:
    # Listed for --help only: the dispatch hands "run" to main() below, which leaves the
    # program's arguments alone.
    commands.add_parser(
        "run",
        help="run a program traced and summarise the snapshot it leaves",
        description="Run a Python program traced from its first line (see 'alloctrace run "
        "--help').",
    )


_RUN_VALUE_OPTIONS = {
    "-n",
    "--nframe",
    "-o",
    "--output",
    "--interval",
    "--sample-interval",
    "--sample-seed",
    "--retention",
    "--memory-limit",
    "--signal",
    "--push",
    "--capture",
    "--capture-keep",
}
_RUN_FLAG_OPTIONS = {"-q", "--quiet", "-h", "--help", "--objects", "--native", "--no-capture"}


def _split_run_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``run`` arguments into our options and the program's command line.

    Our options come first; the program starts at ``-m MODULE`` or at the first argument that
    is not one of our options, and everything after it belongs to the program untouched (as
    with ``python`` itself), even arguments that look like our options.
    """
    ours: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            return ours, list(argv[index + 1 :])
        if arg in ("-m", "-c") or (arg[:2] in ("-m", "-c") and len(arg) > 2):
            return ours, list(argv[index:])
        name = arg.split("=", 1)[0]
        if name in _RUN_VALUE_OPTIONS:
            if "=" in arg:
                ours.append(arg)
                index += 1
            else:
                ours.extend(argv[index : index + 2])
                index += 2
            continue
        if arg.startswith("-n") and len(arg) > 2 or arg.startswith("-o") and len(arg) > 2:
            ours.append(arg)
            index += 1
            continue
        if arg in _RUN_FLAG_OPTIONS or (arg.startswith("-") and arg != "-"):
            # Unknown options are left to argparse, which reports them in one line.
            ours.append(arg)
            index += 1
            continue
        return ours, list(argv[index:])
    return ours, []


def _run_parser() -> common.Parser:
    parser = common.Parser(
        prog=f"{PROG} run",
        description="Run a Python program traced from its first line, its child processes too, "
        "and write their snapshots at exit into a capture directory. The program's exit "
        "status, standard streams, sys.argv and __main__ are as without alloctrace.",
        usage=f"{PROG} run [-n NFRAME] [--interval SECONDS] "
        "[--sample-interval BYTES [--sample-seed N]] [--objects [--retention N]] [--native] "
        "[--no-reattribute] [--memory-limit LIMIT] [--signal SIG] [--push URL] "
        "[--capture DIR [--capture-keep N] | --no-capture | -o FILE] [-q] "
        "(script.py | -m module | -c command) [args ...]",
    )
    common.add_nframe_option(parser)
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="instead of a capture directory, a snapshot file; may contain {pid}, {time}, {n}",
    )
    parser.add_argument(
        "--interval",
        metavar="SECONDS",
        help="also write numbered snapshots every SECONDS (see ALLOCTRACE_INTERVAL)",
    )
    parser.add_argument(
        "--sample-interval",
        metavar="BYTES",
        help="sampled tracing, one sample per BYTES allocated on average (e.g. 512KiB, 2MiB; "
        "0: exact, the default); figures are then estimates (see ALLOCTRACE_SAMPLE_INTERVAL)",
    )
    parser.add_argument(
        "--sample-seed",
        metavar="N",
        help="seed of the sampler, for reproducible runs (see ALLOCTRACE_SAMPLE_SEED)",
    )
    parser.add_argument(
        "--objects",
        action="store_true",
        help="also record the kind of every object (for 'stats --key type') and retention "
        f"reports for the top {_startup.RETENTION_SITES} sites (for 'why'); see "
        "ALLOCTRACE_OBJECTS",
    )
    parser.add_argument(
        "--retention",
        metavar="N",
        help=f"with --objects, retention reports for the top N sites (default: "
        f"{_startup.RETENTION_SITES}; 0: none); see ALLOCTRACE_RETENTION",
    )
    parser.add_argument(
        "--memory-limit",
        metavar="LIMIT",
        help="also write a numbered snapshot, once, when traced memory (SIZE or traced:SIZE), "
        "resident memory (rss:SIZE) or a fraction of the cgroup's memory limit "
        "(cgroup:FRACTION) is first reached, or a MemoryError goes uncaught; the program "
        "runs on (see ALLOCTRACE_MEMORY_LIMIT)",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="also trace the malloc and mmap calls extension modules make themselves, in the "
        "'native' domain (see ALLOCTRACE_NATIVE)",
    )
    parser.add_argument(
        "--no-reattribute",
        action="store_true",
        help="leave objects CPython builds in blocks from its free lists with the traceback of "
        "the block's first allocation, which makes creating objects free of tracing cost, "
        "chiefly in sampled mode (see ALLOCTRACE_REATTRIBUTE)",
    )
    parser.add_argument(
        "--signal",
        metavar="SIG",
        help="also write a numbered snapshot whenever the program receives signal SIG (e.g. "
        "SIGUSR2); 'alloctrace snapshot PID' sends it, to this command's pid or the "
        "program's (see ALLOCTRACE_SIGNAL)",
    )
    parser.add_argument(
        "--push",
        metavar="URL",
        help="also push a memory profile to the Pyroscope-compatible server at URL every 15 s "
        "and at exit (sampled at 512KiB unless --sample-interval says otherwise); the "
        "ALLOCTRACE_PUSH_*, ALLOCTRACE_SERVICE and ALLOCTRACE_TAGS variables are passed on "
        "(see docs/push.md)",
    )
    _tree.add_run_options(parser)
    parser.add_argument("-q", "--quiet", action="store_true", help="no summary after the run")
    return parser


def main(argv: Sequence[str]) -> int:
    """Run ``alloctrace run ARGV...``; returns the exit status (the program's)."""
    ours, program = _split_run_args(argv)
    args = _run_parser().parse_args(ours)
    if not program or program in (["-m"], ["-c"]):
        raise CommandError(
            "nothing to run: give a script, -m MODULE or -c COMMAND (see 'alloctrace run --help')",
            common.USAGE_ERROR,
        )
    if program[0] == "-m":
        name = program[1]
    elif program[0].startswith("-m"):
        name = program[0][2:]
    elif program[0].startswith("-c"):
        name = "c"
    else:
        name = os.path.basename(program[0])
    output = args.output or f"alloctrace-{name}.{{pid}}.snap"
    try:
        _startup.check_path_template(output, "-o/--output")
        if args.interval is not None:
            _startup.parse_interval(args.interval)
        if args.sample_interval is not None:
            _startup.parse_sample_interval(args.sample_interval, "--sample-interval")
        if args.sample_seed is not None:
            _startup.parse_sample_seed(args.sample_seed, "--sample-seed")
            if not _startup.parse_sample_interval(args.sample_interval or "0"):
                raise _startup.ConfigError("--sample-seed needs --sample-interval")
        if args.memory_limit is not None:
            from .._memory_limit import parse_memory_limit

            parse_memory_limit(args.memory_limit, "--memory-limit")
        if args.signal is not None:
            try:
                _startup.parse_signal(args.signal)
            except _startup.ConfigError as exc:
                raise _startup.ConfigError(
                    str(exc).replace(f"{_startup.ENV_SIGNAL}=", "--signal ")
                ) from None
        if args.push is not None:
            from .. import _push

            try:
                _push.settings(args.push)
            except ValueError as exc:
                raise _startup.ConfigError(f"--push: {exc}") from None
        if args.capture_keep is not None:
            _startup.parse_capture_keep(args.capture_keep, "--capture-keep")
            if args.no_capture or (args.output is not None and args.capture is None):
                raise _startup.ConfigError(
                    "--capture-keep bounds a capture: not with --no-capture or -o"
                )
        if args.retention is not None:
            _startup.parse_retention(args.retention, "--retention")
            if not args.objects:
                raise _startup.ConfigError("--retention needs --objects")
    except _startup.ConfigError as exc:
        raise CommandError(str(exc), common.USAGE_ERROR) from None
    if not program[0].startswith("-") and not os.path.exists(program[0]):
        # Checked here: python would report it too, but only after writing an empty snapshot.
        raise CommandError(f"cannot run {program[0]}: No such file or directory{_hint(program)}")
    _check_starts(program)
    capture = _tree.capture_directory(args, name)
    # {time} is fixed here so that the runner knows the file name; {pid} and {n} are the child's.
    started = time.time()
    stamp = _startup.format_time(started)
    template = _fill_template(output, time=stamp, pid="{pid}", n="{n}")

    # The program's settings come from our options alone: ALLOCTRACE variables exported in the
    # user's shell (say ALLOCTRACE_DUMP for other runs) are not passed on.
    env = {name: value for name, value in os.environ.items() if not name.startswith("ALLOCTRACE")}
    env[_startup.ENV_NFRAME] = str(args.nframe)
    if capture is None:
        env[_startup.ENV_DUMP] = os.path.abspath(template)
    else:
        env[_startup.ENV_CAPTURE] = os.path.abspath(capture)
    for option, name in (
        (args.interval, _startup.ENV_INTERVAL),
        (args.sample_interval, _startup.ENV_SAMPLE_INTERVAL),
        (args.sample_seed, _startup.ENV_SAMPLE_SEED),
        ("1" if args.objects else None, _startup.ENV_OBJECTS),
        (args.retention, _startup.ENV_RETENTION),
        (args.memory_limit, _startup.ENV_MEMORY_LIMIT),
        ("1" if args.native else None, _startup.ENV_NATIVE),
        ("0" if args.no_reattribute else None, _startup.ENV_REATTRIBUTE),
        (args.signal, _startup.ENV_SIGNAL),
        (args.capture_keep if capture is not None else None, _startup.ENV_CAPTURE_KEEP),
    ):
        if option is not None:
            env[name] = option
    if args.push is not None:
        from .. import _push

        env[_push.ENV_PUSH] = args.push
        if args.sample_interval is None:
            env[_startup.ENV_SAMPLE_INTERVAL] = str(_push.DEFAULT_SAMPLE_INTERVAL)
        for name in _push.PASSED_ON:
            if name in os.environ:
                env[name] = os.environ[name]
    command = [sys.executable, *program]

    extra = (_startup.parse_signal(args.signal),) if args.signal is not None else ()
    status, pid = _spawn(command, env, extra)
    if capture is not None:
        _tree.finish_capture(capture, pid, status, args.quiet, single=_summarise)
        if status < 0:
            _die_like_child(-status)
        return status
    path = _find_dump(template, pid, started)
    shown = path if path is None or os.path.isabs(output) else os.path.relpath(path)
    if path is None:
        how = f"signal {signal.Signals(-status).name}" if status < 0 else f"status {status}"
        sys.stderr.write(f"{PROG}: no snapshot was written (the program ended with {how})\n")
    elif not args.quiet:
        _summarise(shown)
    if status < 0:
        _die_like_child(-status)
    return status


def _hint(program: list[str]) -> str:
    """What the user probably meant when the program named is a command, not a script:
    ``alloctrace run python app.py`` (run takes what comes after ``python``)."""
    import shutil

    command = shutil.which(program[0])
    if command is None:
        return ""
    rest = " ".join(program[1:]) or "app.py"
    if os.path.basename(program[0]).startswith("python"):
        return (
            f"; {program[0]} is an interpreter: alloctrace run takes what follows it, as in "
            f"'{PROG} run {rest}' (run uses the interpreter alloctrace is installed in, "
            f"{sys.executable})"
        )
    return (
        f"; {program[0]} is a command ({command}): alloctrace run takes a Python script, "
        "-m MODULE or -c CODE"
    )


def _check_starts(program: list[str]) -> None:
    """Refuse a program that would stop before its first line: a script or ``-c`` command
    that does not compile, a ``-m`` module that does not exist.

    Run anyway, it would leave a snapshot of the interpreter's start-up alone, which reads like
    a program that allocated next to nothing. The checks are those the interpreter makes first,
    made by the same interpreter, so they cannot refuse a program that would start.
    """
    first = program[0]
    if first == "-m" or first.startswith("-m"):
        name = program[1] if first == "-m" else first[2:]
        top = name.partition(".")[0]
        if _module_missing(top):
            raise CommandError(
                f"cannot run -m {name}: No module named {top!r}; nothing was run or written"
            )
        return
    if first == "-c" or first.startswith("-c"):
        source: str | bytes = program[1] if first == "-c" else first[2:]
        filename = "<string>"
        shown = "-c"
    else:
        import zipfile

        if not os.path.isfile(first) or zipfile.is_zipfile(first):
            # A directory or zip archive with a __main__.py: python itself finds the code.
            return
        try:
            with open(first, "rb") as file:
                source = file.read()
        except OSError as exc:
            raise CommandError(f"cannot run {first}: {exc.strerror or exc}") from None
        filename = shown = first
    try:
        compile(source, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        where = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
        message = getattr(exc, "msg", None) or str(exc)
        raise CommandError(
            f"cannot run {shown}: {type(exc).__name__}: {message}{where}; nothing was run or "
            "written"
        ) from None


def _module_missing(name: str) -> bool:
    """Whether ``python -m NAME`` would find no top-level module NAME (looked up as the child
    will: the current directory first)."""
    import importlib.util

    saved = sys.path[:]
    sys.path[0:1] = [os.getcwd()]
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        # Let the interpreter itself report whatever this is.
        return False
    finally:
        sys.path[:] = saved


def _fill_template(template: str, **values: str) -> str:
    """Replace some placeholders of a dump path, keeping the others and the escaped braces."""
    import string

    parts = []
    for literal, field, _, _ in string.Formatter().parse(template):
        parts.append(literal.replace("{", "{{").replace("}", "}}"))
        if field is not None:
            parts.append(values.get(field, "{" + field + "}"))
    return "".join(parts)


def _spawn(command: list[str], env: dict[str, str], extra=()) -> tuple[int, int]:
    """Run the program in the foreground; return its status (negative: killed by a signal)
    and its process id. The *extra* signals (``--signal``'s) are passed on to it too: sent to
    this command by hand, they would otherwise end it."""
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        raise CommandError(f"cannot start {command[0]}: {exc.strerror or exc}") from None

    def forward(signum, frame):
        try:
            child.send_signal(signum)
        except OSError:
            pass

    # Ctrl-C reaches the whole foreground process group, the program included: let the program
    # decide what it means and stay alive to summarise. Termination requests sent to us alone
    # are passed on.
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
    for signum in (signal.SIGTERM, signal.SIGHUP, *extra):
        previous[signum] = signal.signal(signum, forward)
    try:
        return child.wait(), child.pid
    finally:
        for signum, handler in previous.items():
            set_handler(signum, handler)


def _die_like_child(signum: int) -> NoReturn:
    """End with the signal that ended the program, so that our parent sees the same thing."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        set_handler(signum, signal.SIG_DFL)
    except (OSError, ValueError):
        # SIGKILL and SIGSTOP cannot be caught, so they already have their default action.
        pass
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)


#: The peak is printed after the exit's lines when it held this much more than the exit.
PEAK_SHOWN_ABOVE = 1.10
#: A line holding this share of the traced memory at exit gets the hint to ask why.
DOMINANT_SHARE = 0.5


def _summarise(shown: str) -> None:
    """The top 10 lines of the program's exit snapshot, then of its peak when it was higher
    than the exit by more than a tenth (else one line says where it is), on stderr (stdout is
    the program's); and, when one line holds most of the memory, how to ask why it is alive."""
    from .._report import format_size

    try:
        snapshot = common.load(shown)
        args = argparse.Namespace(
            key="lineno",
            cumulative=False,
            limit=common.DEFAULT_LIMIT,
            filters=[],
            full_paths=False,
            no_source=False,
        )
        lines = render_stats(shown, snapshot, args, sys.stderr)
        end = common.totals(snapshot)[0]
        if snapshot.peak is not None:
            peak = common.totals(snapshot.peak)[0]
            if peak > end * PEAK_SHOWN_ABOVE:
                lines += ["", *render_stats(shown, snapshot.peak, args, sys.stderr)]
            else:
                lines.append(
                    f"(the peak, {format_size(peak)}, was within a tenth of the end: "
                    f"'{PROG} stats --peak {shown}' shows it)"
                )
        hint = _why_hint(shown, snapshot, end)
    except CommandError as exc:
        sys.stderr.write(f"{PROG}: snapshot written to {shown} but unreadable: {exc}\n")
        return
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.write(f"{PROG}: snapshot written to {shown}; see '{PROG} stats {shown}'\n")
    if hint:
        sys.stderr.write(hint)
    sys.stderr.flush()


def _why_hint(shown: str, snapshot, end: int) -> str:
    """Where one line holds most of what is alive at exit: the two commands that say what
    keeps it alive (object kinds and retention paths), unless the snapshot has them already."""
    if end <= 0 or snapshot.has_objects:
        return ""
    stats = snapshot.statistics("lineno")
    if not stats or stats[0].size < end * DOMINANT_SHARE or not len(stats[0].traceback):
        return ""
    frame = stats[0].traceback[0]
    share = 100 * stats[0].size // end
    return (
        f"{PROG}: {os.path.basename(frame.filename)}:{frame.lineno} holds {share}% of the traced "
        f"memory; to see what keeps it alive, run again with '{PROG} run --objects ...', then "
        f"'{PROG} why FILE'\n"
    )


def _find_dump(template: str, pid: int, started: float) -> str | None:
    """The program's exit snapshot if this run wrote it; with ``{n}``, the last one written."""
    import glob
    import string

    pattern = []
    for literal, field, _, _ in string.Formatter().parse(template):
        pattern.append(glob.escape(literal))
        if field == "pid":
            pattern.append(str(pid))
        elif field is not None:
            pattern.append("*")
    newest = None
    newest_mtime = started - 1.0
    for candidate in glob.glob("".join(pattern)):
        try:
            mtime = os.stat(candidate).st_mtime
        except OSError:
            continue
        if mtime >= newest_mtime:
            newest, newest_mtime = candidate, mtime
    return newest
