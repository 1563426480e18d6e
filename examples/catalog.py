"""A small catalogue loaded from JSON lines, dumped with 25 frames per traceback: the program
behind the export examples and docs/flamegraph.svg.

    python examples/catalog.py catalog.snap
    alloctrace export catalog.snap --format pprof -o heap.pb.gz
    go tool pprof -top heap.pb.gz
    alloctrace flamegraph catalog.snap -o heap.svg

Only the stacks that pass through this file are kept, whichever file allocated (json's decoder
included), so the picture shows the program rather than the interpreter's start-up.
"""

import json
import sys

import alloctrace


class Catalog:
    def __init__(self):
        self.items = {}
        self.index = {}

    def load(self, lines):
        for line in lines:
            record = json.loads(line)
            self.items[record["sku"]] = record
            self.add_to_index(record)

    def add_to_index(self, record):
        for word in record["name"].split():
            self.index.setdefault(word, []).append(record["sku"])


def make_lines(n):
    return [
        json.dumps({"sku": f"SKU{i:06}", "name": f"red wooden chair model {i}", "price": i * 3})
        for i in range(n)
    ]


def render_report(catalog):
    return "\n".join(f"{sku}: {rec['price']}" for sku, rec in catalog.items.items())


def main(path):
    alloctrace.start(25)
    lines = make_lines(5000)
    catalog = Catalog()
    catalog.load(lines)
    report = render_report(catalog)
    mine = alloctrace.Filter(True, __file__, all_frames=True)
    snapshot = alloctrace.take_snapshot().filter_traces([mine])
    snapshot.dump(path)
    alloctrace.stop()
    print(f"{len(catalog.items)} items, report of {len(report)} characters; wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "catalog.snap")
