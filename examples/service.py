"""A long-running service to trace from outside, with periodic snapshots.

Run it with snapshots every second, then compare an early one with a late one offline:

    ALLOCTRACE_DUMP='service-{n}.snap' ALLOCTRACE_INTERVAL=1 python examples/service.py --seconds 5
    alloctrace diff service-1.snap service-5.snap
    python examples/diff_dumps.py service-1.snap service-5.snap

The service stops after --seconds (default 5), on Ctrl-C or on SIGTERM; the last snapshot is
written in every case.
"""

import argparse
import time

# Per-client session data that is never expired: it grows with every new client.
_sessions = {}
# A bounded cache: it fills up, then stays the same size.
_recent = []


def handle(request_id):
    client = f"client-{request_id}"
    _sessions.setdefault(client, []).append(bytes(256))
    _recent.append(str(request_id) * 10)
    if len(_recent) > 100:
        del _recent[0]


def serve(seconds, rate):
    deadline = time.monotonic() + seconds
    request_id = 0
    while time.monotonic() < deadline:
        for _ in range(rate // 10):
            handle(request_id)
            request_id += 1
        time.sleep(0.1)
    return request_id


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="how long to serve")
    parser.add_argument("--rate", type=int, default=2000, help="requests per second")
    args = parser.parse_args()
    try:
        served = serve(args.seconds, args.rate)
    except KeyboardInterrupt:
        print("interrupted")
        return
    print(f"served {served} requests; {len(_sessions)} sessions kept")


if __name__ == "__main__":
    main()
