"""Small C extensions the tests compile themselves (tests/data/*.c), for the tracked-domain,
native-mode and peak tests: one way to build and import them, so that every test links them
the same way and skips the same way where no C compiler is found."""

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

CC = shutil.which("cc") or shutil.which("gcc")

needs_cc = pytest.mark.skipif(
    CC is None or not sys.platform.startswith("linux"), reason="needs a C compiler on Linux"
)


def build(source, directory, name, flags=(), libs=()):
    """Compile tests/data/*source* as extension module *name* in *directory*; return its path.

    *flags* go after the source (link options such as ``-Wl,-z,lazy``), *libs* last."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    path = os.path.join(str(directory), name + suffix)
    include = sysconfig.get_paths()["include"]
    src = os.path.join(os.path.dirname(__file__), "data", source)
    cmd = [CC, "-shared", "-fPIC", "-O1", f"-DMODNAME={name}", "-I", include, src]
    subprocess.run([*cmd, *flags, "-o", path, *libs], check=True, capture_output=True)
    return path


def load(path, name):
    """Import the extension at *path* as module *name* (not through sys.path)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
