"""The build backend refuses, with a message that says what to do, to build without cargo.

maturin's own backend downloads a Rust toolchain into the user's cache when none is on PATH;
ours stops first (build_backend/alloctrace_build.py). The hooks are called in a subprocess with
a PATH that has no cargo, as pip calls them; maturin need not be installed for that.
"""

import os
import pathlib
import stat
import subprocess
import sys

import pytest

BACKEND = pathlib.Path(__file__).resolve().parent.parent / "build_backend"
HOOKS = [
    "get_requires_for_build_wheel()",
    "get_requires_for_build_sdist()",
    "prepare_metadata_for_build_wheel('.')",
    "build_wheel('.')",
    "build_editable('.')",
    "build_sdist('.')",
]


def call_hook(hook, tmp_path, path, **env):
    code = f"import alloctrace_build as backend; backend.{hook}"
    environ = {"PATH": path, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(BACKEND)}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("hook", HOOKS)
def test_no_cargo_on_path_stops_every_hook_with_a_message(tmp_path, hook):
    result = call_hook(hook, tmp_path, path=str(tmp_path / "empty"))
    assert result.returncode == 1
    assert "needs a Rust toolchain (1.85 or newer): no 'cargo' was found on PATH" in result.stderr
    assert "rustup" in result.stderr
    assert "ALLOCTRACE_DOWNLOAD_RUST=1" in result.stderr
    assert "Traceback" not in result.stderr


def test_rustup_toolchain_off_path_is_named(tmp_path):
    cargo = tmp_path / "home" / ".cargo" / "bin" / "cargo"
    cargo.parent.mkdir(parents=True)
    cargo.write_text("#!/bin/sh\n")
    cargo.chmod(0o755)
    result = call_hook(HOOKS[0], tmp_path, path=str(tmp_path / "empty"))
    assert result.returncode == 1
    assert f"{cargo} exists but its directory is not on PATH" in result.stderr


def fake_bin(tmp_path, name):
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path.parent


@pytest.mark.parametrize("download", [None, "1"])
def test_cargo_on_path_or_download_asked_reaches_maturin(tmp_path, download):
    # Past the check the backend imports maturin; where it is not installed that import is what
    # fails, which shows the check let the call through.
    path = str(fake_bin(tmp_path, "cargo")) if download is None else str(tmp_path / "empty")
    env = {} if download is None else {"ALLOCTRACE_DOWNLOAD_RUST": download}
    result = call_hook(HOOKS[0], tmp_path, path=path, **env)
    assert "no 'cargo' was found" not in result.stderr
    try:
        import maturin  # noqa: F401
    except ImportError:
        assert "No module named 'maturin'" in result.stderr
    else:  # pragma: no cover - maturin in the test environment
        assert result.returncode == 0, result.stderr


def test_the_project_builds_with_this_backend():
    pyproject = (BACKEND.parent / "pyproject.toml").read_text()
    assert 'build-backend = "alloctrace_build"' in pyproject
    assert 'backend-path = ["build_backend"]' in pyproject
    assert os.path.isfile(BACKEND / "alloctrace_build.py")
