#!/usr/bin/env bash
# Runs the tracer's pytest suites under valgrind memcheck, on one interpreter, and fails if
# memcheck reports any error. Not part of tests/run.sh (it takes several minutes).
#
#   tests/valgrind.sh                                  # CPython 3.12, default test files
#   PYTHON=/path/to/python3.13 tests/valgrind.sh tests/test_tracer.py
#   VENV=/path/to/venv tests/valgrind.sh               # test what is installed there, no build
#
# CPython's own allocator (pymalloc) hands out memory valgrind cannot see into, so
# PYTHONMALLOC=malloc sends every allocation to the C allocator; our hooks wrap it exactly
# as they wrap pymalloc. Leak checking is off: CPython does not free everything at exit by
# design. Subprocesses started by tests run without valgrind (--trace-children=no); forked
# children stay under it and are checked too.
#
# Suppressions (tests/valgrind.supp) are for CPython's own reports only, each explained
# there. 3.12 is the default because 3.11.7 reports an uninitialised read in its own
# int.from_bytes() at start-up (it happens for `python -c pass`), whose tainted small-int
# pointer then shows up in refcount operations all over the run.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-/root/.pyenv/versions/3.12.1/bin/python3}
work=${ALLOCTRACE_TEST_DIR:-$repo/target/valgrind}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target}
files=("$@")
if [ "${#files[@]}" -eq 0 ]; then
    files=(tests/test_tracer.py tests/test_hostile_api.py tests/test_format.py tests/test_snapshot.py)
fi
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 2; }

minor=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
venv=${VENV:-$work/venv-$minor}
mkdir -p "$work"
if [ -z "${VENV:-}" ]; then
    if [ ! -x "$work/tools/bin/maturin" ]; then
        "$py" -m venv "$work/tools"
        "$work/tools/bin/pip" install -q "maturin>=1.7,<2"
    fi
    if [ ! -x "$venv/bin/pytest" ]; then
        "$py" -m venv "$venv"
        "$venv/bin/pip" install -q "pytest>=7"
    fi
    rm -rf "$work/dist-$minor"
    # Release build: what users run; it keeps line tables, so reports name our source lines.
    "$work/tools/bin/maturin" build --release --quiet -i "$py" -o "$work/dist-$minor"
    "$venv/bin/pip" install -q --force-reinstall --no-deps "$work/dist-$minor"/alloctrace-*.whl
fi

paths=()
for f in "${files[@]}"; do paths+=("$(cd "$repo" && readlink -f "$f")"); done
log=$work/valgrind-$minor.log
run_dir=$(mktemp -d)
trap 'rm -rf "$run_dir"' EXIT
echo "valgrind memcheck on Python $minor: ${files[*]} (log: $log)"
rc=0
(cd "$run_dir" && PYTHONMALLOC=malloc valgrind --tool=memcheck --error-exitcode=99 \
    --leak-check=no --track-origins=yes --num-callers=40 --trace-children=no \
    --suppressions="$repo/tests/valgrind.supp" --log-file="$log" \
    "$venv/bin/python" -m pytest -p no:cacheprovider -q "${paths[@]}") || rc=$?
checked=$(grep -c "ERROR SUMMARY" "$log" || true)
bad=$(grep "ERROR SUMMARY" "$log" | grep -vc "ERROR SUMMARY: 0 errors" || true)
echo "memcheck: $checked processes checked, $bad with errors"
if [ "$rc" -eq 99 ] || [ "$bad" -ne 0 ]; then
    echo "memcheck reported errors: see $log"
    exit 1
fi
exit "$rc"
