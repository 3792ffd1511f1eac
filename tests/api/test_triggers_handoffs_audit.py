"""Triggers, handoffs, the ledger and the audit trail through the API."""

from __future__ import annotations

import json

import pytest

from govflow.engine.models import Instance, InstanceStatus, Token, TriggerDelivery
from govflow.engine.provider import Pending
from recovery.api import decision_request
from recovery.models import Checkpoint
from tests.engine_helpers import evidence, token_of, user_with
from tests.flows import action, drive, linear, start
from tests.providers.alpha import effects

from .conftest import assert_problem, start_instance

pytestmark = pytest.mark.django_db


def deliver(client, **body):
    body = {"message": "report.ready", "payload": {"grade": "A"}, **body}
    return client.post("/api/v1/triggers/deliveries/", body, format="json")


# ---- triggers --------------------------------------------------------------------------


def test_a_delivered_message_wakes_the_waiting_instance(key_client, waiting_definition):
    instance = drive(start_instance(waiting_definition, ref="R-1"))
    response = deliver(key_client, correlation="R-1", delivery_id="d-1")
    assert response.status_code == 202, response.json()
    body = response.json()
    assert response["Location"] == "http://testserver/api/v1/triggers/deliveries/d-1/"
    assert body["state"] == "consumed"
    assert body["delivered_to"]["instance"] == instance.pk
    assert body["delivered_to"]["step"] == "wait"
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED
    assert instance.variables["wait"] == {"grade": "A"}


def test_a_message_before_its_instance_waits_is_kept(key_client, waiting_definition):
    body = deliver(key_client, correlation="R-early", delivery_id="d-early").json()
    assert body["state"] == "received" and body["delivered_to"] is None
    instance = drive(start_instance(waiting_definition, ref="R-early"))
    assert instance.status == InstanceStatus.COMPLETED
    later = key_client.get("/api/v1/triggers/deliveries/d-early/").json()
    assert later["state"] == "consumed" and later["delivered_to"]["instance"] == instance.pk


def test_a_repeated_delivery_id_is_answered_as_the_first_one_was(key_client, waiting_definition):
    drive(start_instance(waiting_definition, ref="R-2"))
    first = deliver(key_client, correlation="R-2", delivery_id="d-2")
    again = deliver(key_client, correlation="R-2", delivery_id="d-2")
    assert (again.status_code, again.json()) == (first.status_code, first.json())
    assert TriggerDelivery.objects.count() == 1
    problem = assert_problem(
        deliver(key_client, correlation="R-3", delivery_id="d-2"), 409, "conflict"
    )
    assert "already used for a different message" in problem["detail"]


def test_delivery_ids_are_per_tenant(keys, waiting_definition):
    north, south = keys(tenant="north"), keys(tenant="south")
    assert deliver(north, correlation="X", delivery_id="same").status_code == 202
    assert deliver(south, correlation="Y", delivery_id="same").status_code == 202
    assert set(TriggerDelivery.objects.values_list("delivery_id", flat=True)) == {
        "north:same",
        "south:same",
    }
    assert north.get("/api/v1/triggers/deliveries/same/").json()["correlation"] == "X"
    assert south.get("/api/v1/triggers/deliveries/same/").json()["correlation"] == "Y"


def test_a_message_is_never_handed_to_another_tenants_instance(keys, waiting_definition):
    theirs = drive(start_instance(waiting_definition, tenant="south", ref="R-shared"))
    answer = deliver(keys(tenant="north"), correlation="R-shared", delivery_id="d-x")
    assert answer.status_code == 202, answer.content
    assert answer.json()["state"] == "received"  # kept for north, not handed to south
    assert Token.objects.get(instance=theirs, node_id="wait").state == "waiting"

    ours = drive(start_instance(waiting_definition, tenant="north", ref="R-shared"))
    assert Instance.objects.get(pk=ours.pk).status == InstanceStatus.COMPLETED
    assert Token.objects.get(instance=theirs, node_id="wait").state == "waiting"
    assert TriggerDelivery.objects.get().token.instance_id == ours.pk


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"correlation": "R", "delivery_id": "has:colon"}, "delivery_id"),
        ({"correlation": "R", "delivery_id": "x" * 100}, "delivery_id"),
        ({"correlation": "", "delivery_id": "ok"}, "correlation"),
        ({"correlation": "R", "delivery_id": "ok", "payload": [1]}, "payload"),
    ],
)
def test_malformed_deliveries_are_422(key_client, body, field):
    problem = assert_problem(deliver(key_client, **body), 422, "validation-failed")
    assert field in [e["field"] for e in problem["errors"]]
    assert not TriggerDelivery.objects.exists()


# ---- handoffs --------------------------------------------------------------------------


def test_handoffs_list_unknown_outcomes_and_pending_providers_with_open_decisions(
    key_client, requester
):
    effects.SCRIPT["alpha.write"] = ["raise_after"]
    uncertain = drive(start(linear(action("a")), tenant="north"))
    effects.SCRIPT["alpha.write"] = [Pending(poll_after=300)]
    pending = drive(start(linear(action("p")), tenant="north"))
    token = token_of(uncertain, "a")
    decision = decision_request(
        operation_key=token.operation_key,
        kind="effect_absent",
        rationale="Not in the store.",
        requested_by=requester,
        evidence=[evidence()],
        checks={"store": "Looked it up."},
        required_checks=["store"],
    )
    listed = key_client.get("/api/v1/handoffs/").json()["results"]
    by_kind = {h["kind"]: h for h in listed}
    assert set(by_kind) == {"outcome_unknown", "pending_provider"}
    unknown = by_kind["outcome_unknown"]
    assert (unknown["instance"], unknown["step"], unknown["action"]) == (
        uncertain.pk,
        "a",
        "alpha.write",
    )
    assert unknown["state_text"].startswith("stopped: the outcome is unknown")
    assert unknown["decision"]["id"] == decision.pk
    assert unknown["decision"]["state"] == "requested"
    assert unknown["decision"]["result_fp"] == ""  # effect absent carries no result
    waiting = by_kind["pending_provider"]
    assert waiting["instance"] == pending.pk and waiting["decision"] is None
    assert waiting["next_poll_at"] is not None
    only = key_client.get("/api/v1/handoffs/?kind=pending_provider").json()["results"]
    assert [h["id"] for h in only] == [waiting["id"]]
    of_instance = key_client.get(f"/api/v1/handoffs/?instance={uncertain.pk}").json()["results"]
    assert [h["id"] for h in of_instance] == [unknown["id"]]
    awaiting = key_client.get("/api/v1/handoffs/?awaiting_approval=true").json()["results"]
    assert [h["id"] for h in awaiting] == [unknown["id"]]
    others = key_client.get("/api/v1/handoffs/?awaiting_approval=false").json()["results"]
    assert [h["id"] for h in others] == [waiting["id"]]
    detail = key_client.get(f"/api/v1/handoffs/{unknown['id']}/").json()
    assert detail == unknown


def test_a_step_that_no_longer_waits_is_no_handoff(key_client, waiting_definition):
    instance = drive(start_instance(waiting_definition))
    token = token_of(instance, "wait")
    assert_problem(key_client.get(f"/api/v1/handoffs/{token.pk}/"), 404, "not-found")


def test_handoffs_cannot_be_decided_through_the_api(key_client, world):
    response = key_client.post(f"/api/v1/handoffs/{world.north_handoff}/", {}, format="json")
    assert_problem(response, 405, "method-not-allowed")


# ---- ledger, chain, verification, audit export ----------------------------------------


def test_ledger_and_chain_show_fingerprints_and_states_only(key_client, world):
    instance = world.north_uncertain
    ledger = key_client.get(f"/api/v1/instances/{instance}/ledger/").json()["results"]
    assert [(op["step"], op["action"], op["state"]) for op in ledger] == [
        ("a", "alpha.write", "outcome_unknown")
    ]
    assert ledger[0]["state_text"] == "Outcome unknown"
    assert all(len(ledger[0][f]) == 64 for f in ("input_fp", "preview_fp", "idempotency_fp"))
    chain = key_client.get(f"/api/v1/instances/{instance}/chain/").json()["results"]
    stored = Checkpoint.objects.filter(subject_id=str(instance)).order_by("seq")
    assert [c["seq"] for c in chain] == [c.seq for c in stored]
    assert [c["link"] for c in chain] == [c.link for c in stored]
    assert chain[0]["prev_link"] == "0" * 64
    assert "value" not in json.dumps(chain)  # the input {"value": …} is never in a fact


def test_verify_reports_a_sound_chain_and_a_broken_one(key_client, world):
    url = f"/api/v1/instances/{world.north_instance}/chain/verify/"
    body = key_client.get(url).json()
    assert body["ok"] is True and body["position"] is None and body["length"] >= 1
    Instance.objects.filter(pk=world.north_instance).update(variables={"ref": "edited"})
    broken = key_client.get(url).json()
    assert broken["ok"] is False
    assert "differs from the one checkpoint" in broken["reason"]


def test_audit_export_as_json_and_as_json_lines(key_client, world):
    url = f"/api/v1/instances/{world.north_uncertain}/audit/"
    stored = list(Checkpoint.objects.filter(subject_id=str(world.north_uncertain)).order_by("seq"))
    whole = key_client.get(url)
    assert whole["Content-Type"] == "application/json"
    body = whole.json()
    assert body["instance"] == world.north_uncertain
    assert body["verification"]["ok"] is True
    assert [c["link"] for c in body["checkpoints"]] == [c.link for c in stored]
    lines = key_client.get(url + "?format=jsonl")
    assert lines["Content-Type"] == "application/jsonl; charset=utf-8"
    rows = [json.loads(line) for line in b"".join(lines.streaming_content).splitlines()]
    assert [r["seq"] for r in rows] == [c.seq for c in stored]
    assert {r["instance"] for r in rows} == {world.north_uncertain}
    by_accept = key_client.get(url, HTTP_ACCEPT="application/jsonl")
    assert by_accept["Content-Type"].startswith("application/jsonl")
    assert_problem(key_client.get(url + "?format=xml"), 400, "malformed-request")


def test_an_integrity_stop_is_a_423_in_the_engines_words(key_client, waiting_definition):
    instance = drive(start_instance(waiting_definition))
    Instance.objects.filter(pk=instance.pk).update(variables={"ref": "edited behind its back"})
    response = key_client.post(
        f"/api/v1/instances/{instance.pk}/cancel/", {"reason": "stop"}, format="json"
    )
    problem = assert_problem(response, 423, "integrity-stop")
    assert problem["detail"].startswith("Integrity incident #")
    assert "differ from the ones its chec" in problem["detail"]
    instance.refresh_from_db()
    assert instance.status != InstanceStatus.CANCELLED


def test_a_session_user_reads_the_ledger_with_the_checkpoint_permission(world, django_user_model):
    from .conftest import client_with

    user = user_with(django_user_model, "auditor", "recovery.view_checkpoint")
    client = client_with()
    client.force_login(user)
    response = client.get(f"/api/v1/instances/{world.south_uncertain}/ledger/")
    assert response.status_code == 200
    assert len(response.json()["results"]) == 1
