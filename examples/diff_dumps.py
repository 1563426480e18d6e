"""Compare two snapshot files offline, in code (``alloctrace diff`` does the same from a shell).

    python examples/diff_dumps.py OLD.snap NEW.snap

Import machinery and untracked frames are filtered out first, as they are rarely what you are
looking for.
"""

import sys

import alloctrace

NOISE = [
    alloctrace.Filter(False, "<frozen importlib._bootstrap>"),
    alloctrace.Filter(False, "<frozen importlib._bootstrap_external>"),
    alloctrace.Filter(False, "<unknown>"),
]


def main(old_path, new_path, limit=5):
    old = alloctrace.Snapshot.load(old_path).filter_traces(NOISE)
    new = alloctrace.Snapshot.load(new_path).filter_traces(NOISE)
    print(f"{new_path} compared to {old_path} (pid {new.metadata['pid']}):")
    for diff in new.compare_to(old, "lineno")[:limit]:
        print(f"  {diff}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: diff_dumps.py OLD.snap NEW.snap")
    main(sys.argv[1], sys.argv[2])
