"""Linked runs (issue 13, part 2): a workflow starts a run in another module and only
watches it. An unknown publication in that module is a cancel-only handoff; the workflow
moves on from a conclusive descriptor only, and a contradicting one is an integrity
incident."""

from __future__ import annotations

import pytest

from govflow.demo.dataflow import services as dataflow
from govflow.demo.dataflow.models import DataflowRun, RunState
from govflow.engine.definitions import DefinitionInvalid
from govflow.engine.errors import EngineConflict
from govflow.engine.linked import RunDescriptor, run_providers
from govflow.engine.models import Instance, InstanceStatus, LinkedRun, Token, TokenState, WaitKind
from govflow.engine.services.instances import instance_cancel
from govflow.engine.services.linked import LINKED_DECISION_REFUSED
from govflow.handoffs.services.desk import handoff_request
from recovery import api
from recovery.api import DecisionKind
from tests.engine_helpers import chain_ok, evidence, graph, make_due, node, publish, user_with
from tests.flows import drive, start

pytestmark = pytest.mark.django_db


def linked_doc(provider: str = "dataflow.publication", **fields) -> dict:
    return graph(
        [
            node("start", "start"),
            node(
                "publish",
                "linked_run",
                run_provider=provider,
                input={"dataset": "dataset", "rows": "rows"},
                **{"output": {"publication.catalogue_id": "catalogue_id"}, **fields},
            ),
            node("end", "end"),
        ],
        [("start", "publish"), ("publish", "end")],
    )


def started(doc: dict | None = None) -> Instance:
    instance = start(doc or linked_doc(), {"dataset": "Parking 2026", "rows": 12})
    return drive(instance)


def watch(instance: Instance) -> Token:
    return Token.objects.get(instance=instance, node_id="publish", wait_kind=WaitKind.LINKED)


def look(instance: Instance) -> Instance:
    """The watch step's next look is due now: run the instance."""
    make_due(watch(instance))
    return drive(instance)


def link_of(instance: Instance) -> LinkedRun:
    return LinkedRun.objects.get(instance=instance)


def test_linked_run_advances_from_a_conclusive_descriptor():
    instance = started()
    # The start is a ledger operation like an action's; the run is then only watched.
    start_token = Token.objects.get(instance=instance, node_id="publish", wait_kind="")
    assert start_token.state == TokenState.COMPLETED
    ops = api.operations_of(api.Subject("govflow.instance", str(instance.pk)))
    assert [(o.key, o.action, o.state) for o in ops] == [
        (start_token.operation_key, "dataflow.publication", "succeeded")
    ]
    assert instance.status == InstanceStatus.WAITING
    assert watch(instance).state == TokenState.READY

    instance = look(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert instance.variables["publication"] == {"catalogue_id": f"CAT-{_run().pk:05d}"}
    link = link_of(instance)
    assert (link.state, link.run_ref, link.polls) == ("succeeded", _run().reference, 2)
    # One start operation only: looks record no ledger operations.
    assert api.operations_of(api.Subject("govflow.instance", str(instance.pk))).count() == 1
    assert chain_ok(instance)


def _run() -> DataflowRun:
    return DataflowRun.objects.get()


def test_a_running_run_is_looked_at_again_with_backoff():
    dataflow.fault_set("hold")
    instance = look(started())
    assert instance.status == InstanceStatus.WAITING
    token = watch(instance)
    assert token.state == TokenState.READY and token.poll == 1
    assert "looking again in 4 s" in token.reason  # poll_backoff 2 s, doubled
    assert link_of(instance).state == "running"
    dataflow.run_publish(run_id=_run().pk)
    instance = look(instance)
    assert instance.status == InstanceStatus.COMPLETED


def test_unknown_publication_is_a_cancel_only_handoff(django_user_model):
    dataflow.fault_set("lost_answer")
    instance = look(started())
    assert _run().state == RunState.UNKNOWN_PUBLICATION
    assert instance.status == InstanceStatus.BLOCKED
    assert "only action here is Cancel" in instance.reason
    token = watch(instance)
    assert token.state == TokenState.READY  # still watched, never outcome_unknown here
    operator = user_with(django_user_model, "op", "engine.operate_instance")
    for kind in (DecisionKind.EFFECT_CONFIRMED, DecisionKind.EFFECT_ABSENT):
        with pytest.raises(EngineConflict) as refused:
            handoff_request(
                instance_id=instance.pk,
                token_id=token.pk,
                kind=kind,
                rationale="I looked at the catalogue myself.",
                actor=operator,
                evidence=[evidence()],
                result={"catalogue_id": "CAT-1"},
            )
        assert str(refused.value) == LINKED_DECISION_REFUSED
    # It keeps looking: still unknown, still the same handoff.
    instance = look(instance)
    assert instance.status == InstanceStatus.BLOCKED and watch(instance).poll == 2


def test_reconciled_in_the_other_module_the_workflow_advances():
    dataflow.fault_set("lost_answer")
    instance = look(started())
    assert instance.status == InstanceStatus.BLOCKED
    dataflow.run_reconcile(run_id=_run().pk)  # Dataflow finds its catalogue entry
    assert _run().state == RunState.PUBLISHED
    instance = look(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert instance.variables["publication"]["catalogue_id"] == f"CAT-{_run().pk:05d}"
    # Dataflow's own ledger: its publication was settled by its own reconcile.
    op = api.operation_get(key=_run().operation_key)
    assert op.state == "effect_confirmed"
    assert chain_ok(instance)


def test_reconciled_absent_takes_the_failure_path():
    dataflow.fault_set("lost_request")
    instance = look(started())
    dataflow.run_reconcile(run_id=_run().pk)
    assert (_run().state, _run().reason_code) == ("failed", "not_published")
    instance = look(instance)
    assert instance.status == InstanceStatus.FAILED
    assert "not_published" in instance.reason


def test_failure_continues_when_the_node_says_so():
    dataflow.fault_set("reject")
    instance = look(started(linked_doc(on_failure="continue", output={"outcome": "state"})))
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert instance.variables["outcome"] == "failed"


def scripted(*answers):
    """A run provider whose descriptors are ``answers``, one per look (the last repeats)."""
    from govflow.demo.dataflow.provider import PUBLICATION

    said = list(answers)

    def describe(ref):
        return said.pop(0) if len(said) > 1 else said[0]

    return _replace(PUBLICATION, name="tests.scripted", describe=describe)


def _replace(provider, **changes):
    import dataclasses

    return dataclasses.replace(provider, **changes)


@pytest.mark.parametrize(
    "later",
    [
        RunDescriptor("failed", reason_code="broken"),
        RunDescriptor("succeeded", outputs={"catalogue_id": "CAT-OTHER"}),
        RunDescriptor("running"),
    ],
    ids=["succeeded-then-failed", "other-outputs", "back-to-running"],
)
def test_contradictory_descriptor_opens_an_integrity_incident(later):
    first = RunDescriptor("succeeded", outputs={"catalogue_id": "CAT-1"})
    with run_providers.override(scripted(first, later)):
        instance = look(started(linked_doc("tests.scripted")))
    assert instance.status == InstanceStatus.BLOCKED
    assert "Integrity incident" in instance.reason
    incidents = api.incidents_of(api.Subject("govflow.instance", str(instance.pk)))
    assert [i.status for i in incidents] == ["open"]
    assert "contradicts its own conclusive answer" in incidents[0].reason
    assert "publication" not in instance.variables  # nothing advanced
    assert link_of(instance).state == "contradicted"
    # Later runs refuse to move it while the incident is open.
    with run_providers.override(scripted(first)):
        instance = look(instance)
    assert instance.status == InstanceStatus.BLOCKED
    assert "publication" not in instance.variables


def test_unknown_run_provider_is_a_clear_parse_error():
    with pytest.raises(DefinitionInvalid) as invalid:
        publish(linked_doc("nope.runs"))
    assert "node 'publish': no installed module registers the run provider 'nope.runs'" in str(
        invalid.value
    )
    assert "dataflow.publication" in str(invalid.value)


def test_bad_on_failure_is_refused():
    with pytest.raises(DefinitionInvalid) as invalid:
        publish(linked_doc(on_failure="retry"))
    assert "'on_failure' must be \"fail\"" in str(invalid.value)


def test_uncertain_start_is_settled_by_the_same_key(monkeypatch):
    """The worker's start call died after Dataflow created the run: the start is
    outcome_unknown, and Dataflow's lookup by the same idempotency key finds that run —
    no second run is started."""
    from govflow.demo.dataflow import provider

    real = provider.start

    def crashed(context):
        real(context)
        raise ConnectionError("the answer was lost")

    with run_providers.override(_replace(provider.PUBLICATION, start=crashed)):
        instance = started()
        start_token = Token.objects.get(instance=instance, node_id="publish", wait_kind="")
        assert start_token.state == TokenState.COMPLETED  # settled by Dataflow's lookup
    assert DataflowRun.objects.count() == 1
    assert _run().idempotency_key == start_token.idempotency_key
    assert watch(instance).idempotency_key == start_token.idempotency_key
    assert api.operation_get(key=start_token.operation_key).state == "effect_confirmed"
    instance = look(instance)
    assert instance.status == InstanceStatus.COMPLETED


def test_cancel_asks_the_other_module_to_stop_its_run(django_user_model):
    dataflow.fault_set("hold")
    instance = started()
    operator = user_with(django_user_model, "op", "engine.operate_instance")
    instance_cancel(instance_id=instance.pk, actor=operator, reason="Withdrawn by the office.")
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.CANCELLED
    assert link_of(instance).cancel_requested_at is not None
    assert _run().state == RunState.CANCELLED


def test_cancel_of_an_unknown_publication_leaves_it_to_the_other_module(django_user_model):
    dataflow.fault_set("lost_answer")
    instance = look(started())
    operator = user_with(django_user_model, "op", "engine.operate_instance")
    instance_cancel(instance_id=instance.pk, actor=operator, reason="Not needed any more.")
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.CANCELLED
    assert _run().state == RunState.UNKNOWN_PUBLICATION  # Dataflow's to settle


def test_the_start_contract_is_pinned_with_the_definition():
    """A run provider's start is pinned like an action: a release that changes its checks
    stops running instances before their next step."""
    import json

    from govflow.demo.dataflow.provider import PUBLICATION
    from govflow.engine.provider import VerificationCheck

    dataflow.fault_set("hold")
    instance = started()
    assert "dataflow.publication" in json.loads(instance.definition.contracts)
    changed = _replace(PUBLICATION, checks=(VerificationCheck("other", "Look elsewhere."),))
    with run_providers.override(changed):
        instance = look(instance)
    assert instance.status == InstanceStatus.BLOCKED
    assert "dataflow.publication" in instance.reason and "changed" in instance.reason


def test_an_uncertain_start_confirmed_by_two_people_watches_the_named_run(django_user_model):
    """Without the module's lookup, an uncertain start is an ordinary outcome-unknown
    handoff: effect confirmed carries the run's reference, and that run is watched."""
    from govflow.demo.dataflow import provider
    from govflow.handoffs.services.desk import handoff_approve

    real = provider.start

    def crashed(context):
        real(context)
        raise ConnectionError("the answer was lost")

    requester = user_with(
        django_user_model, "rhea", "engine.operate_instance", "recovery.request_decision"
    )
    approver = user_with(django_user_model, "arno", "recovery.approve_decision")
    with run_providers.override(_replace(provider.PUBLICATION, start=crashed, find=None)):
        instance = started()
        start_token = Token.objects.get(instance=instance, node_id="publish")
        assert start_token.state == TokenState.OUTCOME_UNKNOWN
        assert instance.status == InstanceStatus.BLOCKED
        decision = handoff_request(
            instance_id=instance.pk,
            token_id=start_token.pk,
            kind=DecisionKind.EFFECT_CONFIRMED,
            rationale="Dataflow lists the run for this key.",
            actor=requester,
            evidence=[evidence()],
            checks={"dataflow-runs": "DF-00001 has this key."},
            result={"run": _run().reference},
        )
        handoff_approve(decision_id=decision.pk, actor=approver, result_fp=decision.result_fp)
        instance = look(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert link_of(instance).run_ref == _run().reference
    assert DataflowRun.objects.count() == 1
