"""Trace a piece of work from inside the program and keep the snapshot for later.

    python examples/in_code.py [work.snap]

Tracing with 10 frames per traceback shows *who called* the function that allocates, not only
the allocating line; the snapshot file can then be explored with ``alloctrace stats``.
"""

import sys

import alloctrace


def make_row(i):
    return {"id": i, "name": f"user{i}", "tags": ["a", "b", "c"]}


def load_table(n):
    return [make_row(i) for i in range(n)]


def report():
    table = load_table(5000)
    index = {row["name"]: row for row in table}
    return table, index


def main(path):
    alloctrace.start(10)
    data = report()
    snapshot = alloctrace.take_snapshot()
    alloctrace.stop()

    biggest = snapshot.statistics("traceback")[0]
    print(f"Biggest: {biggest.count} blocks, {biggest.size / 1024:.1f} KiB, allocated from:")
    for line in biggest.traceback.format():
        print(line)
    snapshot.dump(path)
    print(f"snapshot written to {path}; try: alloctrace stats {path} --key traceback")
    return data


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "in_code.snap")
