"""CPython's own regression tests, untraced and then traced from start-up, side by side.

By hand, not in tests/run.sh (five to ten minutes per interpreter on two cores)::

    python3 tests/regrtest.py VENV/bin/python            # the default list below
    python3 tests/regrtest.py VENV/bin/python test_json test_re
    python3 tests/regrtest.py --option VENV/bin/python   # -X alloctrace=25, not the variable

VENV's interpreter must have alloctrace installed (tests/run.sh leaves one venv per
interpreter under target/test-run/). Each run is ``python -m test -j2`` over the same test
files, once without tracing and once with ``ALLOCTRACE=25`` (or ``-X alloctrace=25``, which
regrtest passes on to its workers); the output is kept in the directory given by ``--out``.
Prints the test files that fail only under tracing, and exits with 1 if there is any that is
not among :data:`EXPECTED`; those fail by design, see docs/reliability.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

#: Pure Python and C-backed areas that exercise allocation, objects' lifetimes, threads,
#: signals, subprocesses and the C API; none needs the network or a GUI.
DEFAULT_TESTS = """
test_json test_re test_weakref test_gc test_dict test_set test_descr test_threading test_sys
test_copy test_pickle test_list test_tuple test_float test_long test_bytes test_collections
test_functools test_itertools test_generators test_coroutines test_asyncgen test_contextlib
test_exceptions test_class test_dataclasses test_enum test_typing test_io test_os test_signal
test_sqlite3 test_decimal test_fractions test_statistics test_struct test_array test_memoryview
test_tracemalloc test_faulthandler test_ast test_compile test_grammar test_traceback
test_inspect test_zipfile test_xml_etree test_email test_logging test_capi test_ctypes test_csv
test_datetime test_heapq test_bisect test_deque test_ordered_dict test_userdict test_weakset
test_finalization test_threading_local test_thread test_queue test_select test_mmap test_zlib
test_pprint test_string test_format test_marshal test_code test_frame test_sys_settrace
test_sys_setprofile test_scope test_super test_property test_raise test_with test_iter
test_unpack test_genexps test_listcomps test_setcomps test_dictcomps test_slice test_sort
test_bool test_int test_complex test_math test_cmath test_operator test_types test_abc
test_copyreg test_shelve test_dbm test_gzip test_bz2 test_lzma test_tempfile test_shutil
test_glob test_fnmatch test_pathlib test_argparse test_textwrap test_difflib test_html
test_htmlparser test_urlparse test_base64 test_binascii test_hashlib test_hmac test_secrets
test_uuid test_ipaddress test_calendar test_time test_sched test_selectors test_asyncio
""".split()

#: Test files that fail under tracing by design, with the reason.
EXPECTED = {
    "test_tracemalloc": "TestCAPI.test_stop_(un)track expect PyTraceMalloc_Track to fail "
    "after tracemalloc.stop(); alloctrace, still tracing, records the call",
    "test_code": "a dead code object is released at the tracer's next sweep, not at once",
}


def failed(output: str) -> set[str]:
    """The test files regrtest's summary lists as failed (crashed ones included)."""
    names: set[str] = set()
    lines = output.splitlines()
    for n, line in enumerate(lines):
        if re.match(r"^\d+ tests? failed:$", line.strip()):
            for follow in lines[n + 1 :]:
                if not follow.startswith("    "):
                    break
                names.update(follow.split())
    return names


def installed(python: str, tests: list[str]) -> list[str]:
    """The *tests* the interpreter has (Debian ships them apart, in libpython3.X-testsuite)."""
    probe = (
        "import importlib.util, sys\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        found = importlib.util.find_spec('test.' + name) is not None\n"
        "    except ImportError:\n"
        "        found = False\n"
        "    if found:\n"
        "        print(name)\n"
    )
    done = subprocess.run([python, "-c", probe, *tests], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{python} cannot run: {done.stderr.strip()}")
    return done.stdout.split()


def run(python: str, tests: list[str], traced: bool, option: bool, log: Path) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALLOCTRACE")}
    env.pop("PYTHONTRACEMALLOC", None)
    args = [python]
    if traced and option:
        args += ["-X", "alloctrace=25"]
    elif traced:
        env["ALLOCTRACE"] = "25"
    args += ["-m", "test", "-j2", "--timeout", "900", *tests]
    started = time.monotonic()
    done = subprocess.run(args, env=env, capture_output=True, text=True, cwd="/tmp")
    log.write_text(done.stdout + done.stderr)
    names = failed(done.stdout)
    what = "traced" if traced else "untraced"
    print(
        f"{what}: exit {done.returncode}, {time.monotonic() - started:.0f} s, "
        f"failed: {' '.join(sorted(names)) or 'none'} ({log})",
        flush=True,
    )
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("python", help="an interpreter with alloctrace installed")
    parser.add_argument("tests", nargs="*", help="regrtest names (default: a fixed list)")
    parser.add_argument("--option", action="store_true", help="trace with -X alloctrace=25")
    parser.add_argument("--out", default="target/regrtest", help="where the logs go")
    args = parser.parse_args(argv)
    wanted = args.tests or DEFAULT_TESTS
    tests = installed(args.python, wanted)
    missing = [name for name in wanted if name not in tests]
    if not tests:
        raise SystemExit(f"{args.python} has none of the test files asked for (no test suite?)")
    if missing:
        print(f"not installed for this interpreter, left out: {' '.join(missing)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plain = run(args.python, tests, False, args.option, out / "untraced.log")
    traced = run(args.python, tests, True, args.option, out / "traced.log")
    only_traced = sorted(traced - plain)
    for name in only_traced:
        print(f"  {name}: {EXPECTED.get(name, 'UNEXPECTED')}")
    unexpected = [name for name in only_traced if name not in EXPECTED]
    print(f"{len(unexpected)} unexpected failure(s) under tracing")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
