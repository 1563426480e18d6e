"""Memory checks in a test suite: ``pytest examples/pytest_memory.py`` (docs/pytest.md).

Two of the four tests fail on purpose: ``test_report`` allocates more than its limit, and
``test_handle_request`` leaks a session per request into a module-level list. The cache filled
by ``test_lookup``'s first call is not a leak; ``test_small`` stays under its limit.
"""

import pytest

SESSIONS = []
CACHE = {}


def handle_request(user):
    session = {"user": user, "history": [f"page-{i}" for i in range(500)]}
    SESSIONS.append(session)  # forgotten: never removed
    return len(session["history"])


def lookup(key):
    if key not in CACHE:
        CACHE[key] = [bytes(100) for _ in range(10_000)]
    return CACHE[key]


def build_report(n):
    return [f"line {i}: {'x' * 80}" for i in range(n)]


@pytest.mark.limit_memory("1 MB")
def test_report():
    report = build_report(20_000)
    assert len(report) == 20_000


@pytest.mark.limit_memory("1 MB")
def test_small():
    assert len(build_report(1000)) == 1000


@pytest.mark.limit_leaks("10 KB")
def test_handle_request():
    assert handle_request("ada") == 500


@pytest.mark.limit_leaks("10 KB")
def test_lookup():
    assert len(lookup("k")) == 10_000
