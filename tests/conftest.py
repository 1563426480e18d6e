"""Shared pytest setup: the report header says which alloctrace build is under test, and
``stopped_tracer`` gives a test a stopped, unfiltered, recording tracer and leaves it so."""

import os

import pytest

import alloctrace


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
