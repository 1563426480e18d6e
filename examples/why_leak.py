"""Why is it alive: from the line that grows to what holds its memory, offline.

    python examples/why_leak.py before.snap after.snap
    alloctrace diff before.snap after.snap --limit 3
    alloctrace why after.snap --line why_leak.py:31

The second snapshot is taken with ``retention=3, baseline=before``: for the three sites that
grew most it records what holds their objects, sample reference chains and retained sizes, so
``alloctrace why`` can explain the growth later, without the process.
"""

import sys

import alloctrace


class Session:
    def __init__(self, client):
        self.client = client
        self.history = []


_sessions = {}


def handle(request_id):
    client = f"client-{request_id % 500}"
    session = _sessions.get(client)
    if session is None:
        session = _sessions[client] = Session(client)
    session.history.append(bytes(200))  # the leak: a session's history is never trimmed


def main():
    before_path, after_path = sys.argv[1:3]
    alloctrace.start()
    for request_id in range(1000):
        handle(request_id)
    before = alloctrace.take_snapshot()
    before.dump(before_path)
    for request_id in range(1000, 21000):
        handle(request_id)
    after = alloctrace.take_snapshot(retention=3, baseline=before)
    after.dump(after_path)
    print(f"{len(_sessions)} sessions, {sum(len(s.history) for s in _sessions.values())} entries")


if __name__ == "__main__":
    main()
