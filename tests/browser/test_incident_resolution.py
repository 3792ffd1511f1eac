"""An integrity incident in a real browser: seen on the instance, resolved by two people.

Rita finds the instance blocked by an incident, follows the link to it, and requests its
resolution once the edited row is restored; Rob, the second pair of eyes, approves it, and
the instance is queued to continue.
"""

from __future__ import annotations

import pytest

from govflow.engine.models import InstanceStatus
from recovery import api
from recovery.models import IncidentResolution, IntegrityIncident, Operation
from tests.engine_helpers import marked_runnable, unmark_all
from tests.flows import action, drive, linear, start

from .conftest import make_user

pytestmark = pytest.mark.django_db(transaction=True)

RESOLVERS = (
    "engine.view_instance",
    "recovery.view_integrityincident",
    "recovery.resolve_incident",
)
RATIONALE = "Restored the operation row from the 02:00 backup and compared it with the chain."


def test_an_incident_is_followed_from_its_instance_and_resolved_by_two_people(
    browser, django_user_model, tmp_path
):
    make_user(django_user_model, "rita", *RESOLVERS)
    make_user(django_user_model, "rob", *RESOLVERS)
    instance = start(
        linear(
            action("a"),
            {"id": "sign", "type": "approval", "permission": "engine.view_instance"},
            action("b"),
        )
    )
    instance = drive(instance)
    subject = api.Subject("govflow.instance", str(instance.pk))
    operation = Operation.objects.get(subject_type=subject.type, subject_id=subject.id)
    Operation.objects.filter(pk=operation.pk).update(ordinal=operation.ordinal + 3)
    _, incident = api.subject_verify(subject=subject)

    rita = browser
    rita.log_in("rita", "pw-rita")
    rita.open(f"/admin/engine/instance/{instance.pk}/change/")
    status = rita.section("Status")
    assert f"Blocked by integrity incident #{incident.pk}: operation " in status
    assert "ordinal is" in status
    rita.follow(f"integrity incident #{incident.pk}")
    assert rita.title == f"Integrity incident {incident.pk}"
    broken_at = f"Still broken at checkpoint #{operation.chain_seq}"
    assert broken_at in rita.section("Checkpoint chain now")

    rita.fill("rationale", RATIONALE)
    rita.press("Request resolution")
    assert any("cannot be resolved yet" in e for e in rita.errors())
    assert rita.value("rationale") == RATIONALE
    assert not IncidentResolution.objects.exists()

    Operation.objects.filter(pk=operation.pk).update(ordinal=operation.ordinal)  # repaired
    rita.open(f"/admin/recovery/integrityincident/{incident.pk}/change/")
    assert "verifies now" in rita.section("Checkpoint chain now")
    rita.fill("rationale", RATIONALE)
    rita.press("Request resolution")
    resolution = IncidentResolution.objects.get()
    assert any(f"Resolution request {resolution.pk} of incident" in m for m in rita.messages())
    assert "Approve resolution" not in rita.buttons()
    assert "Withdraw request" in rita.buttons()
    rita.screenshot(tmp_path / "requested.png")
    rita.log_out()

    rob = browser
    rob.log_in("rob", "pw-rob")
    rob.open(f"/admin/recovery/integrityincident/{incident.pk}/change/")
    assert RATIONALE in rob.section("Resolution")
    unmark_all()
    rob.press("Approve resolution")
    assert any(
        f"Incident {incident.pk} is resolved" in m and f"Instance {instance.pk} is queued" in m
        for m in rob.messages()
    )
    assert "approved by rob" in rob.section("Incident")
    assert marked_runnable() == [instance.pk]
    rob.follow(f"open workflow instance {instance.pk}")
    assert "Blocked by" not in rob.section("Status")
    rob.screenshot(tmp_path / "resolved.png")
    assert IntegrityIncident.objects.get(pk=incident.pk).resolved_by.username == "rob"
    assert instance.status == InstanceStatus.WAITING
