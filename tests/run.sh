#!/usr/bin/env bash
# Runs every check and test of alloctrace: formatting and lints (Rust and Python), the Rust unit
# tests, then, for EVERY supported CPython found on this machine (3.9 to 3.13), a release wheel
# built and installed into a fresh virtual environment and the pytest suite run against it.
# Installs what it needs (maturin, pytest, ruff) from PyPI. Exit status 0 only if all passed.
# Debian packages that some tests use (golang-go, chromium) are installed only in CI (CI=true) or
# when asked (ALLOCTRACE_TEST_INSTALL=1, as root); elsewhere those tests skip and say why.
# Each phase's duration is printed as it ends, and all of them at the end.
#
#   tests/run.sh            # everything (about 35 minutes on a quiet 2-core machine)
#   PYTHONS="3.11" tests/run.sh   # only some interpreters (for a quicker local run)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
work=${ALLOCTRACE_TEST_DIR:-$repo/target/test-run}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target}
mkdir -p "$work"
cd "$repo"

log() { printf '\n==> %s\n' "$*"; }

# Phase timing: each phase ends when the next begins, and its duration is kept for the summary
# printed before the verdict (or at exit, when a check stops the script early).
phase_name=""
phase_start=$SECONDS
phases=()
phase() {
    if [ -n "$phase_name" ]; then
        phases+=("$(printf '%4dm%02ds  %s' $(((SECONDS - phase_start) / 60)) $(((SECONDS - phase_start) % 60)) "$phase_name")")
        printf -- '--- %s took %ds\n' "$phase_name" $((SECONDS - phase_start))
    fi
    phase_name=$1
    phase_start=$SECONDS
    [ -n "$phase_name" ] && log "$phase_name"
    return 0
}
summary_done=""
summary() {
    [ -z "$summary_done" ] || return 0
    summary_done=1
    phase ""
    printf '\n==> time per phase (total %dm%02ds)\n' $((SECONDS / 60)) $((SECONDS % 60))
    printf '%s\n' "${phases[@]}"
}
trap summary EXIT

# May this run install Debian packages? In CI, or when asked, and only as root with apt-get.
may_install() {
    { [ "${CI:-}" = true ] || [ "${ALLOCTRACE_TEST_INSTALL:-}" = 1 ]; } &&
        command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]
}

# Every supported interpreter we can find: pyenv's own installs first, then the system's
# (/usr/bin, /usr/local/bin: a distribution's build, such as Debian's python3.11 with libpython
# linked statically, differs from pyenv's shared one in ways alloctrace must handle), then
# whatever python3.X is on PATH. One run per installation (the same binary reached twice, by a
# pyenv shim or a venv, counts once), each labelled by its minor version, with the binary's
# path added for a second installation of that version. Prints "label=python" lines.
find_pythons() {
    local candidates=() seen=" " minors=" " py info minor exe label
    for py in /root/.pyenv/versions/3.*/bin/python3 \
        /usr/bin/python3.{9,10,11,12,13} /usr/local/bin/python3.{9,10,11,12,13} \
        "$(command -v python3.9 || true)" "$(command -v python3.10 || true)" \
        "$(command -v python3.11 || true)" "$(command -v python3.12 || true)" \
        "$(command -v python3.13 || true)"; do
        [ -x "$py" ] || continue
        info=$("$py" -c 'import os, sys; print("%d.%d" % sys.version_info[:2], os.path.realpath(sys.executable))' 2>/dev/null) || continue
        minor=${info%% *}
        exe=${info#* }
        case "$minor" in 3.9 | 3.10 | 3.11 | 3.12 | 3.13) ;; *) continue ;; esac
        case "$seen" in *" $exe "*) continue ;; esac
        if [ -n "${PYTHONS:-}" ] && [[ " $PYTHONS " != *" $minor "* ]]; then continue; fi
        seen="$seen$exe "
        label=$minor
        case "$minors" in *" $minor "*) label="$minor($exe)" ;; esac
        minors="$minors$minor "
        candidates+=("$label=$py")
    done
    printf '%s\n' "${candidates[@]}" | sort -t. -k2 -n -s
}

mapfile -t pythons < <(find_pythons)
if [ "${#pythons[@]}" -eq 0 ]; then
    echo "no supported Python (3.9-3.13) found" >&2
    exit 1
fi
log "interpreters: ${pythons[*]}"

# The tool venv (maturin, ruff) uses the newest interpreter found.
tool_py=${pythons[-1]#*=}
tools=$work/tools
if [ ! -x "$tools/bin/maturin" ] || [ ! -x "$tools/bin/ruff" ]; then
    phase "installing maturin and ruff"
    "$tool_py" -m venv "$tools"
    "$tools/bin/pip" install -q --upgrade pip
    "$tools/bin/pip" install -q "maturin>=1.7,<2" "ruff>=0.6"
fi

phase "cargo fmt --check"
cargo fmt --check
phase "ruff check / ruff format --check"
"$tools/bin/ruff" check .
"$tools/bin/ruff" format --check .

# pyo3 needs an interpreter for lints and Rust tests; any supported one will do.
rust_py=${pythons[0]#*=}
rust_libdir=$("$rust_py" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')
phase "cargo clippy (-D warnings)"
PYO3_PYTHON=$rust_py cargo clippy --all-targets -- -D warnings
phase "cargo test"
PYO3_PYTHON=$rust_py LD_LIBRARY_PATH=$rust_libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} cargo test

# Debian packages some tests use, installed where we may (see may_install); otherwise, or if
# the install fails, those tests skip and say why. tests/test_export.py reads our pprof files
# back with `go tool pprof`; tests/test_html_report.py opens the report in headless Chromium;
# tests/test_attach.py attaches to running processes through lldb; tests/test_native.py
# preloads jemalloc. A tool is a command, or a file's path.
apt_updated=""
install_for() {
    local tool=$1 package=$2 tests=$3
    { command -v "$tool" || [ -e "$tool" ]; } >/dev/null && return 0
    if ! may_install; then
        echo "note: $tool is not installed, so $tests will skip;" \
            "ALLOCTRACE_TEST_INSTALL=1 lets this script install $package (as CI does)"
        return 0
    fi
    phase "installing $package (for $tests)"
    if ! ({ [ -n "$apt_updated" ] || timeout 300 apt-get update -qq; } &&
        DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "$package") \
        >"$work/apt-$package.log" 2>&1; then
        echo "could not install $package (see $work/apt-$package.log); $tests will skip"
    fi
    apt_updated=1
}
install_for go golang-go "the pprof read-back tests"
install_for chromium chromium "the HTML report's browser tests"
install_for lldb lldb "the attach tests"
install_for /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 libjemalloc2 "the preloaded-jemalloc test"

# An interpreter's own copy of CPython's test_tracemalloc.py (tests/test_conformance.py runs it),
# or nothing where its distribution ships the tests apart (Debian's libpython3.X-testsuite).
cpython_tests() {
    "$1" -c 'import pathlib, sysconfig
p = pathlib.Path(sysconfig.get_path("stdlib"), "test", "test_tracemalloc.py")
print(p if p.is_file() else "")' 2>/dev/null || true
}

failed=()
for entry in "${pythons[@]}"; do
    label=${entry%%=*}
    py=${entry#*=}
    # A directory name for the label: "3.11" stays, "3.11(/usr/bin/python3.11)" becomes
    # "3.11-usr-bin-python3.11".
    name=$(printf '%s' "$label" | tr -c 'A-Za-z0-9.\n' '-' | tr -s '-')
    name=${name%-}
    venv=$work/venv-$name
    phase "Python $label ($py): build wheel, install, pytest"
    if [ ! -x "$venv/bin/pytest" ]; then
        "$py" -m venv "$venv"
        "$venv/bin/pip" install -q --upgrade pip
    fi
    # What the tests use (pytest, and the third-party packages some tests run under tracing).
    "$venv/bin/pip" install -q -r "$repo/tests/requirements.txt"
    rm -rf "$work/dist-$name"
    "$tools/bin/maturin" build --release --quiet -i "$py" -o "$work/dist-$name"
    "$venv/bin/pip" install -q --force-reinstall --no-deps "$work/dist-$name"/alloctrace-*.whl
    # Without tests of its own, this interpreter runs those of the first install of its version.
    other_tests=""
    if [ -z "$(cpython_tests "$py")" ]; then
        for other in "${pythons[@]}"; do
            if [ "${other%%=*}" = "${label%%(*}" ]; then
                other_tests=$(cpython_tests "${other#*=}")
            fi
        done
    fi
    # Run from an empty directory so that only the installed package can be imported. -rs lists
    # each skipped test with its reason.
    run_dir=$(mktemp -d)
    if ! (cd "$run_dir" && ALLOCTRACE_CPYTHON_TESTS="$other_tests" \
        "$venv/bin/python" -m pytest -p no:cacheprovider -q -rs "$repo/tests"); then
        failed+=("$label")
    fi
    rm -rf "$run_dir"
done

summary
if [ "${#failed[@]}" -ne 0 ]; then
    log "FAILED on Python ${failed[*]}"
    exit 1
fi
log "all checks passed on Python ${pythons[*]%%=*}"
