"""Shared pytest setup: the report header says which alloctrace build is under test."""

import os

import alloctrace


def pytest_report_header(config):
    return f"alloctrace {alloctrace.__version__} from {os.path.dirname(alloctrace.__file__)}"
