"""Giving back the pages lldb maps in a process while it evaluates expressions.

lldb runs each expression's code and data in pages its server maps in the target (the
``_M`` packet of the GDB remote protocol) and keeps them when it detaches: four pages, about
16 KiB of resident memory, per attach or detach. The server frees such a page when asked with
``_m ADDRESS``, and refuses any address it did not map itself ("Memory not allocated by the
debugger"), so asking for every page that appeared during the session can free only lldb's
own, never the program's.

lldb cannot compute a command from what it has seen, so this file runs beside it, through
``platform shell``: once after attaching (``save``: the target's mappings, while it is
stopped) and once after the last expression (``release``: the commands that free each page
of the anonymous mappings that are new since), which lldb then reads with ``command source``.
It runs as a script, with nothing but the standard library, in the command's interpreter.
"""

from __future__ import annotations

import sys

#: A new anonymous mapping larger than this is not lldb's (its pages come one or a few at a
#: time); the program mapped it while other threads ran, and it is not asked about.
LARGEST = 64 * 1024

PAGE = 4096


def anonymous(maps: str) -> set[tuple[int, int]]:
    """The (start, end) of each mapping of a ``/proc/PID/maps`` text that has no name."""
    found = set()
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) == 5:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            found.add((start, end))
    return found


def release_commands(before: str, after: str) -> list[str]:
    """The lldb commands asking its server to free each page of the anonymous mappings in
    *after* that *before* does not have."""
    commands = []
    for start, end in sorted(anonymous(after) - anonymous(before)):
        if end - start <= LARGEST:
            commands += [
                f"process plugin packet send _m{page:x}" for page in range(start, end, PAGE)
            ]
    return commands


def main(argv: list[str]) -> int:
    """``save PID FILE`` or ``release PID FILE OUT``. Always exits 0, and ``release`` always
    writes OUT (empty when anything went wrong): lldb in batch mode stops at the first failed
    command, and the detach after this one must run."""
    action, pid, path = argv[0], int(argv[1]), argv[2]
    commands: list[str] = []
    try:
        with open(f"/proc/{pid}/maps") as stream:
            now = stream.read()
        if action == "save":
            with open(path, "w") as stream:
                stream.write(now)
            return 0
        with open(path) as stream:
            commands = release_commands(stream.read(), now)
    except (OSError, ValueError):
        pass
    if action == "release":
        with open(argv[3], "w") as stream:
            stream.write("".join(line + "\n" for line in commands))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
