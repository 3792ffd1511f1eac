"""Facts of the caller's own on a subject's chain (recovery.api.fact_append)."""

from __future__ import annotations

import pytest

from recovery import api
from recovery.models import IntegrityIncident

pytestmark = pytest.mark.django_db


def test_a_fact_of_your_own_is_linked_into_the_chain_and_read_back(subject):
    assert api.fact_append(subject=subject, kind="engine.contract_migrated", fact={"a": 1}) == 1
    assert api.fact_append(subject=subject, kind="engine.other", fact={"b": [2]}) == 2
    api.fact_append(subject=subject, kind="engine.contract_migrated", fact={"a": 3})
    assert api.facts_read(subject=subject, kind="engine.contract_migrated") == [{"a": 1}, {"a": 3}]
    assert api.chain_verify(subject).ok
    assert api.subject_revision(subject) == 3


@pytest.mark.parametrize(
    ("kind", "fact", "says"),
    [
        ("operation.recorded", {}, "are the ledger's own"),
        ("decision.approved", {}, "are the ledger's own"),
        ("nonamespace", {}, "a namespaced name"),
        ("engine.x", {"operation": "op-1", "state": "succeeded"}, "may not name an 'operation'"),
        ("engine.x", {"value": float("nan")}, "not a finite number"),
    ],
)
def test_a_fact_that_could_pass_for_the_ledgers_own_is_refused(subject, kind, fact, says):
    with pytest.raises(api.RecoveryValidationError, match=says):
        api.fact_append(subject=subject, kind=kind, fact=fact)
    assert api.subject_revision(subject) == 0


def test_a_contradiction_found_outside_the_chain_opens_one_incident(subject):
    first = api.incident_report(subject=subject, reason="the stored document changed")
    again = api.incident_report(subject=subject, reason="found again")
    assert again.pk == first.pk and first.position is None
    assert IntegrityIncident.objects.get().reason == "the stored document changed"
    with pytest.raises(api.RecoveryValidationError, match="needs a reason"):
        api.incident_report(subject=subject, reason=" ")
