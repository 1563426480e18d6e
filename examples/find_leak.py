"""Find a leak from inside the program: snapshot, do the suspect work, snapshot again, diff.

    python examples/find_leak.py

This is the in-code version of ``alloctrace diff``: the differences are sorted by how much
each line grew, so the leaking line comes first.
"""

import alloctrace


class Parser:
    # A class-level list shared by every instance: the classic accidental leak.
    seen = []

    def parse(self, text):
        words = text.split()
        self.seen.append(words)
        return len(words)


def handle_batch(batch):
    parser = Parser()
    return sum(parser.parse(line) for line in batch)


def main():
    batch = [f"line {i} of some input text" for i in range(200)]
    alloctrace.start()
    handle_batch(batch)  # warm up: first-call allocations are not leaks
    before = alloctrace.take_snapshot()
    for _ in range(20):
        handle_batch(batch)
    after = alloctrace.take_snapshot()
    alloctrace.stop()

    print("Top 3 differences:")
    for diff in after.compare_to(before, "lineno")[:3]:
        print(f"  {diff}")


if __name__ == "__main__":
    main()
