"""Schemathesis over the whole OpenAPI schema: no server errors, every response as documented.

Every operation gets a bounded number of generated requests (valid and invalid ones), sent
in-process through Django's WSGI handler with a key that holds every scope, against a
database with two tenants' instances, handoffs and deliveries in it. Each response must not
be a 5xx, must have a documented status code and content type, and must match its schema
(errors included: every one is a problem). Runs on SQLite and on PostgreSQL, like every test.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from .conftest import make_key

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
# Bounded and repeatable in the suite; GOVFLOW_SCHEMATHESIS_EXAMPLES=500 runs a deeper,
# randomised search (what found the bugs this test now guards against).
EXAMPLES = int(os.environ.get("GOVFLOW_SCHEMATHESIS_EXAMPLES", 12))
DERANDOMIZE = "GOVFLOW_SCHEMATHESIS_EXAMPLES" not in os.environ


@pytest.fixture
def keep_the_test_connection():
    """Requests go through the plain WSGI handler, whose request signals would close the
    test's database connection (and its transaction); Django's test client detaches them
    the same way."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def auth_headers(db, world, settings, keep_the_test_connection):
    settings.GOVFLOW_API_RATE = ""  # no rate limit: this test sends hundreds of requests
    settings.GOVFLOW_API_ANON_RATE = ""
    _, raw = make_key(name="schemathesis")
    return {"Authorization": f"Api-Key {raw}"}


# Loaded from the served endpoint when the tests are collected (one test per operation).
# (schemathesis' fixture-based lazy loading does not work with pytest 9 yet.)
schema = schemathesis.openapi.from_wsgi("/api/v1/schema/", WSGIHandler())


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=DERANDOMIZE,
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_answers_as_its_schema_says(case, auth_headers):
    case.call_and_validate(headers=auth_headers, checks=CHECKS)
