"""Eight requests with one Idempotency-Key racing on PostgreSQL: exactly one runs.

The unique constraint on (owner, key) decides: one request inserts the in-progress record
and starts the instance; every other one is answered 409 (still in flight) or, once the
first finished, with its stored response. Never a second instance.
"""

from __future__ import annotations

import threading

import pytest

from govflow.engine.models import Instance
from govflow.engine.services.definitions import definition_publish
from tests.api.conftest import client_with, make_key, waiting_document
from tests.concurrency.test_lease_race import WAIT, run_threads

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.usefixtures("on_postgres"),
]

RACERS = 8


def test_racing_requests_with_one_idempotency_key_start_one_instance():
    definition_publish(document=waiting_document())
    _, raw = make_key()
    body = {"definition": "tests.api_wait", "variables": {"ref": "R-race"}}
    ready = threading.Barrier(RACERS)

    def racer():
        client = client_with(raw)
        ready.wait(timeout=WAIT)
        response = client.post(
            "/api/v1/instances/", body, format="json", HTTP_IDEMPOTENCY_KEY="race-1"
        )
        return response.status_code, response.get("Idempotent-Replayed"), response.json()

    results = run_threads([racer] * RACERS, barriers=(ready,))
    assert Instance.objects.count() == 1
    instance = Instance.objects.get()
    fresh = [r for r in results if r[0] == 201 and r[1] is None]
    replayed = [r for r in results if r[0] == 201 and r[1] == "true"]
    in_flight = [r for r in results if r[0] == 409]
    assert len(fresh) == 1, results
    assert len(fresh) + len(replayed) + len(in_flight) == RACERS, results
    assert {r[2]["id"] for r in fresh + replayed} == {instance.pk}
    assert {r[2]["code"] for r in in_flight} <= {"idempotency-key-in-use"}
