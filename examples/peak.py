"""A batch job whose memory peaks in the middle: the example behind the peak section of the
README. Run it with

    alloctrace run examples/peak.py

which prints the top lines alive at exit, then those alive at the peak, and writes the
snapshot (with its peak) for ``alloctrace stats --peak`` and ``alloctrace diff --peak``.
"""


def parse(n):
    rows = [{"id": i, "name": f"item {i}"} for i in range(n)]
    return rows


def build_index(rows):
    return {row["name"]: row for row in rows}


def main():
    rows = parse(50_000)
    index = build_index(rows)
    total = sum(len(name) for name in index)
    del rows, index  # the peak is gone before the job ends
    summary = [str(total)] * 10
    print(" ".join(summary[:1]))


if __name__ == "__main__":
    main()
