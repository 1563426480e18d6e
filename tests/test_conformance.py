"""CPython's own tracemalloc tests, run against alloctrace.

``test/test_tracemalloc.py`` is loaded from the running interpreter's standard library at test
time (it is never copied into this project) with ``sys.modules["tracemalloc"]`` pointing at
``alloctrace`` while the module is imported and while each test runs, so every
``tracemalloc.X`` in it, ``unittest.mock.patch("tracemalloc...")`` included, reaches
alloctrace. Each unittest test of the classes in ``CLASSES`` is one pytest item.

Debian and Ubuntu ship CPython's tests in a package of their own (``libpython3.X-testsuite``),
so their ``/usr/bin/python3.X`` usually has no such file. For it, ``tests/run.sh`` names in
``ALLOCTRACE_CPYTHON_TESTS`` the file of another install of the same version (pyenv's), which
is read only when the interpreter has none of its own and only if it is that version's.

A test that cannot pass for a reason rooted in CPython goes in ``KNOWN_FAILURES``, with the
versions it affects; it is then marked ``xfail(strict=True)``, so the entry has to go once the
test passes.
"""

import contextlib
import importlib.util
import os
import sys
import sysconfig
import unittest
from pathlib import Path

import pytest

import alloctrace
from alloctrace import _native

CLASSES = ("TestTraceback", "TestSnapshot", "TestFilters", "TestTracemallocEnabled")

# "Class.test_name": (versions affected as "3.X" strings, reason rooted in CPython)
KNOWN_FAILURES: dict = {
    "TestTracemallocEnabled.test_new_reference": (
        # Only where alloctrace cannot see object creations (docs/freelists.md).
        ("3.9", "3.10", "3.11", "3.12", "3.13") if _native._freelist_mechanism() is None else (),
        "An object reused from one of CPython's free lists (here a list) is created without "
        "calling the allocator, so a PEP 445 hook never sees it; this interpreter offers "
        "alloctrace no way to see the object's creation (a statically linked 3.9 or 3.10 "
        "that inlined _Py_NewReference into its callers), so it keeps the traceback of the "
        "allocation that first made the memory.",
    ),
}

VERSION = f"{sys.version_info[0]}.{sys.version_info[1]}"
OWN_TEST_FILE = Path(sysconfig.get_path("stdlib")) / "test" / "test_tracemalloc.py"


def cpython_tests_file():
    """The interpreter's own test file, or the same version's named by tests/run.sh."""
    other = os.environ.get("ALLOCTRACE_CPYTHON_TESTS")
    if OWN_TEST_FILE.exists() or not other:
        return OWN_TEST_FILE
    other = Path(other)
    # .../lib/python3.X/test/test_tracemalloc.py: another version's tests would fail for
    # reasons that are not alloctrace's.
    if other.parent.parent.name != f"python{VERSION}":
        return OWN_TEST_FILE
    return other


TEST_FILE = cpython_tests_file()


@contextlib.contextmanager
def tracemalloc_is_alloctrace():
    """Make ``import tracemalloc`` (and ``mock.patch("tracemalloc.…")``) give alloctrace."""
    missing = object()
    saved = sys.modules.get("tracemalloc", missing)
    sys.modules["tracemalloc"] = alloctrace
    try:
        yield
    finally:
        if saved is missing:
            del sys.modules["tracemalloc"]
        else:
            sys.modules["tracemalloc"] = saved


def load_cpython_tests():
    """Import the interpreter's test_tracemalloc under a private name, or return the reason
    it cannot be."""
    if not TEST_FILE.exists():
        return None, f"{TEST_FILE} is not installed with this interpreter"
    spec = importlib.util.spec_from_file_location("_cpython_test_tracemalloc", TEST_FILE)
    module = importlib.util.module_from_spec(spec)
    try:
        with tracemalloc_is_alloctrace():
            spec.loader.exec_module(module)
    except Exception as exc:  # the stdlib test package may be trimmed on some installs
        return None, f"cannot import {TEST_FILE}: {exc!r}"
    return module, None


CPYTHON_TESTS, LOAD_ERROR = load_cpython_tests()


def cpython_test_ids():
    if CPYTHON_TESTS is None:
        return []
    loader = unittest.TestLoader()
    ids = []
    for class_name in CLASSES:
        cls = getattr(CPYTHON_TESTS, class_name, None)
        if cls is None:
            continue
        ids.extend(f"{class_name}.{name}" for name in loader.getTestCaseNames(cls))
    return ids


def params():
    out = []
    for test_id in cpython_test_ids():
        marks = []
        known = KNOWN_FAILURES.get(test_id)
        if known is not None and VERSION in known[0]:
            marks.append(pytest.mark.xfail(strict=True, reason=known[1]))
        out.append(pytest.param(test_id, id=test_id, marks=marks))
    return out


def test_cpython_suite_is_loaded():
    """The harness must find the tests; an empty parametrisation would pass silently."""
    if CPYTHON_TESTS is None:
        named = os.environ.get("ALLOCTRACE_CPYTHON_TESTS")
        if named:
            # tests/run.sh promised a file for an interpreter without one: not a skip.
            pytest.fail(
                f"ALLOCTRACE_CPYTHON_TESTS={named} is not a CPython {VERSION} "
                f"test_tracemalloc.py that this interpreter can load ({LOAD_ERROR})"
            )
        pytest.skip(LOAD_ERROR)
    ids = cpython_test_ids()
    assert "TestSnapshot.test_filter_traces" in ids
    assert "TestFilters.test_filter_match_filename_joker" in ids


@pytest.mark.parametrize("test_id", params())
def test_cpython(test_id):
    class_name, method = test_id.split(".")
    case = getattr(CPYTHON_TESTS, class_name)(method)
    result = unittest.TestResult()
    with tracemalloc_is_alloctrace():
        case.run(result)
    if result.skipped:
        pytest.skip(result.skipped[0][1])
    problems = result.errors + result.failures
    if problems:
        pytest.fail("\n".join(text for _, text in problems), pytrace=False)
    assert result.wasSuccessful()
