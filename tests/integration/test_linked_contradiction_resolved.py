"""After a contradiction's incident is resolved, the module's answer is taken anew (ADR 0036).

The workflow never moved on the contradicted conclusion (a conclusion needs a second look
that agrees), so once two people resolved the incident the recorded conclusion is set aside,
on the chain, and the watch needs two agreeing looks again: GovFlow still decides nothing
about another module's run.
"""

from __future__ import annotations

import pytest

from govflow.engine.linked import RunDescriptor, run_providers
from govflow.engine.models import InstanceStatus
from govflow.handoffs.services.integrity import integrity_incident_resolve_approve
from recovery import api
from tests.engine_helpers import chain_ok
from tests.integration.test_linked_runs import link_of, linked_doc, look, scripted, started

pytestmark = pytest.mark.django_db

FIRST = RunDescriptor("succeeded", outputs={"catalogue_id": "CAT-1"})
CORRECTED = RunDescriptor("succeeded", outputs={"catalogue_id": "CAT-2"})


def subject_of(instance) -> api.Subject:
    return api.Subject("govflow.instance", str(instance.pk))


def resolve(instance, resolver, second_resolver) -> None:
    [incident] = api.incidents_of(subject_of(instance))
    api.incident_resolve_request(
        incident_id=incident.pk,
        requested_by=resolver,
        rationale="Dataflow republished the dataset under a new catalogue id; its run "
        "record was corrected. The module's current answer is the true one.",
    )
    outcome = integrity_incident_resolve_approve(incident_id=incident.pk, actor=second_resolver)
    assert outcome.resolved, outcome.message


def fact_kinds(instance) -> list[str]:
    from recovery.models import Checkpoint

    subject = subject_of(instance)
    return list(
        Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id)
        .order_by("seq")
        .values_list("kind", flat=True)
    )


def test_a_resolved_contradiction_takes_the_modules_answer_anew_after_two_looks(
    resolver, second_resolver
):
    with run_providers.override(scripted(FIRST, CORRECTED)):
        instance = look(started(linked_doc("tests.scripted")))
        assert link_of(instance).state == "contradicted"
        resolve(instance, resolver, second_resolver)
        instance = look(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert instance.variables["publication"] == {"catalogue_id": "CAT-2"}
    link = link_of(instance)
    assert (link.state, link.outputs) == ("succeeded", {"catalogue_id": "CAT-2"})
    kinds = fact_kinds(instance)
    assert kinds.count("linked_run.conclusion_reset") == 1
    # The conclusion set aside stays on record before the new one.
    assert kinds.index("linked_run.conclusion_reset") < len(kinds) - 1
    assert chain_ok(instance)


def test_after_the_reset_a_new_contradiction_is_an_incident_again(resolver, second_resolver):
    failed = RunDescriptor("failed", reason_code="withdrawn")
    # First, a contradiction; after the resolution: CAT-2 once, then failed.
    answers = [FIRST, CORRECTED, CORRECTED, failed]
    with run_providers.override(scripted(*answers)):
        instance = look(started(linked_doc("tests.scripted")))
        resolve(instance, resolver, second_resolver)
        instance = look(instance)
    assert instance.status == InstanceStatus.BLOCKED
    assert "Integrity incident" in instance.reason
    assert sorted(i.status for i in api.incidents_of(subject_of(instance))) == ["open", "resolved"]
    assert "publication" not in instance.variables
