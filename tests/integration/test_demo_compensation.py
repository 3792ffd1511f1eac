"""The demo's compensation: cancelling a permit after its fee was collected refunds it."""

from __future__ import annotations

import pytest

from govflow.demo import store
from govflow.demo.sample import sample_variables
from govflow.engine.models import WaitKind
from govflow.engine.services.instances import instance_cancel, instance_start
from govflow.engine.services.runtime import instance_run
from recovery import api
from tests.engine_helpers import chain_ok, user_with
from tests.integration.test_demo import demo_store, drive, published, waiting  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(django_user_model):
    return user_with(django_user_model, "operator", "engine.operate_instance")


def paid(published):  # noqa: F811
    instance = drive(
        instance_start(definition=published["demo.building_permit"], variables=sample_variables())
    )
    waiting(instance, WaitKind.TIMER)  # the fee is paid: the objection period runs
    return instance


def test_cancelling_after_the_fee_was_collected_refunds_it(published, operator):  # noqa: F811
    instance = paid(published)
    reference = instance.variables["payment"]["reference"]
    application_id = instance.variables["application"]["id"]
    instance_cancel(instance_id=instance.pk, actor=operator, reason="The applicant withdrew.")
    drive(instance)
    [refund] = api.compensations_of(api.Subject("govflow.instance", str(instance.pk)))
    assert (refund.step_id, refund.action, refund.state) == (
        "collect_fee",
        "demo.refund_fee",
        "succeeded",
    )
    [row] = store.records_for(application_id)["refunds"]
    assert row["payment_reference"] == reference
    assert row["refund_reference"].startswith("REF-")
    assert chain_ok(instance)
    drive(instance)  # never repeated
    assert len(store.records_for(application_id)["refunds"]) == 1


def test_cancelling_before_the_fee_was_collected_refunds_nothing(published, operator):  # noqa: F811
    instance = instance_start(
        definition=published["demo.building_permit"], variables=sample_variables()
    )
    # One run: registered, and the fee requested; the citizen has not paid yet (pending).
    instance_run(instance_id=instance.pk, worker="test-worker")
    instance.refresh_from_db()
    assert not instance.variables.get("payment")
    instance_cancel(instance_id=instance.pk, actor=operator, reason="The applicant withdrew.")
    drive(instance)
    assert api.compensations_of(api.Subject("govflow.instance", str(instance.pk))) == []
    assert store.count("refunds") == 0
