"""A program that leaks: every "request" leaves an entry in a cache nobody ever trims.

Run it traced and see where the memory went:

    alloctrace run examples/leak.py

The top line of the summary points at the ``_cache[...] = ...`` line in ``handle``.
"""

import sys

_cache = {}


def render(request_id):
    # Short-lived: freed as soon as the response is sent, so it does not show up at the end.
    return f"<p>request {request_id}</p>" * 20


def handle(request_id):
    body = render(request_id)
    # The leak: one 1 KiB entry per request, kept forever.
    _cache[request_id] = bytearray(1024)
    return len(body)


def main(requests):
    sent = 0
    for request_id in range(requests):
        sent += handle(request_id)
    print(f"served {requests} requests, {sent} bytes; cache holds {len(_cache)} entries")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
