"""Each path that edits a run's variables is fingerprinted (ADR 0044), on both databases.

A run keeps its projection's instance part between changes; the paths that change the
variables in place say so (``Run.apply_output``). Under the tests every fingerprint a run
gives is also compared with a whole recomputation (``projection.CHECKED``, set by
``tests/conftest.py``), and the chain's newest projection must equal the stored rows'.
"""

from __future__ import annotations

import pytest

from govflow.engine import projection
from govflow.engine.models import InstanceStatus
from govflow.engine.projection import stored_projection
from govflow.engine.services.triggers import trigger_deliver
from recovery import api
from tests.engine_helpers import node, subject
from tests.flows import action, drive, linear, start

pytestmark = pytest.mark.django_db(transaction=True)


def _recorded_is_stored(instance) -> None:
    verification = api.chain_verify(subject(instance))
    assert verification.ok, verification.reason
    assert verification.projection == stored_projection(str(instance.pk))


def test_the_checked_fingerprints_are_on_under_the_tests():
    assert projection.CHECKED


def test_a_steps_output_and_a_delivered_payload_change_the_recorded_projection():
    document = linear(
        node("w", "trigger", message="payment", correlation="case.id", output={"paid": "amount"}),
        action("a1"),
        action("a2", value="a1.stored"),
    )
    instance = drive(start(document, {"value": "v1", "case": {"id": "C-9"}}))
    assert instance.status == InstanceStatus.WAITING
    _recorded_is_stored(instance)
    trigger_deliver(message="payment", correlation="C-9", delivery_id="d-1", payload={"amount": 5})
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    # The wait's payload, then each step's output, became variables in place.
    assert instance.variables["paid"] == 5
    assert instance.variables["a1"]["stored"] == "v1"
    assert instance.variables["a2"]["stored"] == "v1"
    _recorded_is_stored(instance)
