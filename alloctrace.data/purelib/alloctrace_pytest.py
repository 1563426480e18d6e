"""alloctrace's pytest plugin, as pytest loads it (the ``pytest11`` entry point): options and
markers only.

It lives outside the ``alloctrace`` package and imports nothing but pytest, so that a test run
that asks for none of it imports nothing of alloctrace, starts no tracing and runs as if the
plugin were not installed. The plugin proper, :mod:`alloctrace._pytest_plugin`, is loaded
when an ``--alloctrace*`` option asks for it, or when a collected test carries a
``limit_memory`` or ``limit_leaks`` marker. See docs/pytest.md.
"""

import sys

import pytest

PLUGIN_NAME = "alloctrace-session"

MARKERS = (
    "limit_memory(limit): fail the test if the memory it allocates, at its peak during the "
    "test body, exceeds limit (a size: '24 MB', '512 KiB', 1000000). Traced by alloctrace.",
    "limit_leaks(limit, *, warmup=1, runs=3, filter=None): run the test body warmup + runs "
    "times and fail if memory allocated in the counted runs and still alive at the end "
    "exceeds limit per run at any allocation site. Traced by alloctrace.",
)

OPTIONS = (
    "alloctrace",
    "alloctrace_limit",
    "alloctrace_top",
    "alloctrace_baseline",
    "alloctrace_save_baseline",
)


def pytest_addoption(parser):
    group = parser.getgroup("alloctrace", "memory limits and leak checks (alloctrace)")
    group.addoption(
        "--alloctrace",
        action="store_true",
        default=False,
        help="measure the peak memory of every test body (tests without a marker included)",
    )
    group.addoption(
        "--alloctrace-limit",
        metavar="SIZE",
        help="a limit_memory(SIZE) for every test that has no limit_memory marker",
    )
    group.addoption(
        "--alloctrace-top",
        metavar="N",
        help="end the session with a table of the N tests with the highest peaks",
    )
    group.addoption(
        "--alloctrace-baseline",
        metavar="FILE",
        help="fail tests whose peak grew past the tolerance over the peak recorded in FILE",
    )
    group.addoption(
        "--alloctrace-save-baseline",
        metavar="FILE",
        help="record every test's peak in FILE (for --alloctrace-baseline)",
    )
    group.addoption(
        "--alloctrace-tolerance",
        metavar="PCT[+SIZE]",
        help="growth over the baseline allowed before a test fails (default: 10%%+64KiB)",
    )


def pytest_configure(config):
    _allocation_lines_in_reports()
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    if any(config.getoption(name) for name in OPTIONS) or config.getoption("alloctrace_tolerance"):
        _activate(config)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    plugin = config.pluginmanager.get_plugin(PLUGIN_NAME)
    if plugin is None:
        marked = any(
            item.get_closest_marker("limit_memory") or item.get_closest_marker("limit_leaks")
            for item in items
        )
        if not marked:
            return
        plugin = _activate(config)
    plugin.collected(items)


def _activate(config):
    import pluggy

    version = tuple(int(p) for p in pluggy.__version__.split(".")[:2] if p.isdigit())
    if version < (1, 2):
        raise pytest.UsageError(
            f"alloctrace's pytest plugin needs pluggy 1.2 or newer (pytest 8 has it); "
            f"this is pluggy {pluggy.__version__}"
        )
    from alloctrace._pytest_plugin import SessionPlugin

    plugin = SessionPlugin(config)
    config.pluginmanager.register(plugin, PLUGIN_NAME)
    return plugin


def _allocation_lines_in_reports():
    """Have pytest's reports of a warning about an object (``ResourceWarning``), of an
    unraisable exception and of a thread's exception say where the object was allocated
    while alloctrace traces, as they do while tracemalloc traces.

    pytest asks ``tracemalloc`` only (``_pytest.tracemalloc.tracemalloc_message``, which its
    warnings, unraisable-exception and thread-exception plugins import by name). The wrapper
    changes nothing unless alloctrace is already imported and tracing (``python -X
    alloctrace -m pytest``, ``ALLOCTRACE=N``, or a test that started it) and has a traceback
    for the object, so a run that asks for none of alloctrace still imports nothing of it.
    Older pytest (before 8) formats these itself and is left as it is.
    """
    try:
        from _pytest import tracemalloc as reports
    except ImportError:
        return
    original = getattr(reports, "tracemalloc_message", None)
    if original is None or getattr(original, "_alloctrace_lines", False):
        return

    def tracemalloc_message(source):
        message = original(source)
        alloctrace = sys.modules.get("alloctrace")
        if source is None or alloctrace is None or "Object allocated at" in message:
            return message
        try:
            if not alloctrace.is_tracing():
                return message
            traceback = alloctrace.get_object_traceback(source)
            if traceback is None:
                return message
            return "\nObject allocated at:\n" + "\n".join(traceback.format())
        except Exception:
            # A report must not fail for this; at shutdown the tracer may be gone.
            return message

    tracemalloc_message._alloctrace_lines = True
    tracemalloc_message.__doc__ = original.__doc__
    reports.tracemalloc_message = tracemalloc_message
    for name in ("_pytest.warnings", "_pytest.unraisableexception", "_pytest.threadexception"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "tracemalloc_message", None) is original:
            module.tracemalloc_message = tracemalloc_message
