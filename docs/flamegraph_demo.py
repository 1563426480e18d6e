"""The program behind docs/flamegraph.svg: a small catalogue loaded from JSON lines.

Regenerate the picture from this directory (relative paths keep the frames short):

    python -c "import runpy; runpy.run_path('flamegraph_demo.py', run_name='__main__')"
"""

import json

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


def main():
    alloctrace.start(25)
    lines = make_lines(5000)
    catalog = Catalog()
    catalog.load(lines)
    report = render_report(catalog)
    # Every stack that passes through this file, whichever file allocated.
    mine = alloctrace.Filter(True, __file__, all_frames=True)
    snapshot = alloctrace.take_snapshot().filter_traces([mine])
    snapshot.to_flamegraph("flamegraph.svg", title="flamegraph_demo.py: live memory by stack")
    alloctrace.stop()
    return report


if __name__ == "__main__":
    main()
