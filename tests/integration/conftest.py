"""Fixtures shared by the integration tests."""

import contextlib

import pytest

from recovery import api


@pytest.fixture(params=["one_call", "separate"])
def path(request):
    """Both ledger paths on PostgreSQL: the one-call statements (ADR 0031, 0035) and the
    separate ones inside ``recovery.api.multi_statement()``. SQLite has only the separate
    path, so there both parameters run it."""
    forced = api.multi_statement() if request.param == "separate" else contextlib.nullcontext()
    with forced:
        yield request.param
