"""Shared pytest setup: the report header says which alloctrace build is under test, and
``stopped_tracer`` gives a test a stopped, unfiltered, recording tracer and leaves it so."""

import os
import signal

import pytest

import alloctrace

# A command started in the background by a non-interactive shell (`tests/run.sh &`, nohup) runs
# with SIGINT ignored, and every child inherits that: a child sent SIGINT by a test would then
# never see KeyboardInterrupt. Children of a process that *handles* SIGINT get the default
# disposition back at exec, so handling it here makes the Ctrl-C tests mean the same everywhere.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def stopped_tracer():
    alloctrace.stop()
    alloctrace.clear_filters()
    yield
    alloctrace.stop()
    alloctrace.clear_filters()
    alloctrace.enable()


def pytest_report_header(config):
    return f"alloctrace {alloctrace.__version__} from {os.path.dirname(alloctrace.__file__)}"
