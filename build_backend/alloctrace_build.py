"""The PEP 517 build backend of alloctrace: maturin's, without its silent Rust download.

maturin's backend, when it finds no ``cargo`` on PATH, asks pip for ``puccinialin`` and
downloads a whole Rust toolchain (about 700 MB) into the user's cache, saying nothing. A user
who reads "a Rust toolchain is required" and has none, or has one that is merely not on PATH
(rustup's ``~/.cargo/bin`` in a shell that has not sourced ``~/.cargo/env``), deserves to be
told so instead. This module checks first, then hands every hook to maturin unchanged;
``ALLOCTRACE_DOWNLOAD_RUST=1`` lets maturin download as it would.

maturin is imported only once the check has passed, so that the check runs (and is tested)
where maturin is not installed.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

#: Set to 1 to let maturin download a Rust toolchain when none is on PATH.
DOWNLOAD_VARIABLE = "ALLOCTRACE_DOWNLOAD_RUST"


def missing_rust_message(path: str | None = None, home: str | None = None) -> str | None:
    """The message explaining why the build cannot start, or None when cargo is on PATH.

    *path* and *home* default to the environment's PATH and home directory.
    """
    if os.environ.get(DOWNLOAD_VARIABLE, "") not in ("", "0"):
        return None
    if path is None:
        path = os.environ.get("PATH", "")
    if shutil.which("cargo", path=path):
        return None
    lines = [
        "alloctrace is built from source and needs a Rust toolchain (1.85 or newer): no 'cargo' "
        "was found on PATH.",
    ]
    rustup_cargo = Path(home if home is not None else Path.home(), ".cargo", "bin", "cargo")
    if rustup_cargo.is_file():
        lines.append(
            f"{rustup_cargo} exists but its directory is not on PATH: run "
            "'. \"$HOME/.cargo/env\"' (or add ~/.cargo/bin to PATH) and install again."
        )
    else:
        lines.append(
            "Install one with rustup (https://rustup.rs), or your distribution's 'cargo' "
            "package, and install again."
        )
    lines.append(
        f"Or set {DOWNLOAD_VARIABLE}=1 to let maturin download a private toolchain into your "
        "cache (about 700 MB)."
    )
    return "\n".join(lines)


def _maturin():
    message = missing_rust_message()
    if message is not None:
        # SystemExit with a string: pip shows these lines, not a traceback.
        print(message, file=sys.stderr)
        raise SystemExit("error: no Rust toolchain (see above)")
    import maturin

    return maturin


def get_requires_for_build_wheel(config_settings=None):
    return _maturin().get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    return _maturin().get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _maturin().prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _maturin().build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _maturin().build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    return _maturin().build_sdist(sdist_directory, config_settings)
