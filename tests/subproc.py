"""Child Python processes for the start-up, CLI and example tests.

A child gets this process's environment minus every setting that would change what it traces
or prints (``ALLOCTRACE*``, ``PYTHONTRACEMALLOC``, ``COLUMNS``), so that each test states
exactly the settings it depends on.
"""

import json
import os
import signal
import subprocess
import sys

TIMEOUT = 120


def numbered_name(path, n):
    """The name of numbered snapshot *n* of a dump path without ``{n}``: ``app.snap`` ->
    ``app.1.snap``."""
    root, extension = os.path.splitext(str(path))
    return f"{root}.{n}{extension}"


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALLOCTRACE")}
    env.pop("PYTHONTRACEMALLOC", None)
    env.pop("COLUMNS", None)
    env.update(extra)
    return env


def run_python(args, cwd=None, *, timeout=None, preexec_fn=None, **env):
    """Runs ``python ARGS`` with :func:`clean_env` plus *env*; output captured as text.
    *preexec_fn* runs in the child before Python starts (say, to set a resource limit).
    *timeout* defaults to :data:`TIMEOUT` as it is when called (tests lower it).

    The child leads a process group of its own, and a timeout kills the whole group: a hung
    grandchild (a forked child of a fork test) would otherwise keep the output pipes open, and
    ``subprocess.run`` would wait for them for ever after killing only the child."""
    if timeout is None:
        timeout = TIMEOUT
    with subprocess.Popen(
        [sys.executable, *args],
        env=clean_env(**env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=preexec_fn,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def per_tracer(args, parse=json.loads):
    """Runs ``python ARGS TRACER`` for tracemalloc and for alloctrace, each in a process of its
    own, so that neither inherits what the other left (free lists, the heap's layout); returns
    ``{tracer: parse(stdout)}``."""
    found = {}
    for tracer in ("tracemalloc", "alloctrace"):
        done = run_python([*args, tracer])
        assert done.returncode == 0, done.stderr
        found[tracer] = parse(done.stdout)
    return found
