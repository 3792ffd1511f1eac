"""``/api/v1/instances/<id>/compensations/``: list an instance's compensations, start those
of an ended instance. Approving one stays with two people on the desk (decisions)."""

from __future__ import annotations

import pytest

from govflow.engine.services.instances import instance_cancel
from govflow.handoffs.services.compensations import compensation_request_run
from recovery import api
from tests.engine_helpers import user_with
from tests.flows import action, drive, linear, start
from tests.identity import verified_login

from .conftest import ALL_SCOPES, assert_problem

pytestmark = pytest.mark.django_db
WAIT = {"id": "wait", "type": "timer", "duration": "PT1H"}
READ_START = ["compensations:read", "compensations:start"]


def url(instance) -> str:
    return f"/api/v1/instances/{instance.pk}/compensations/"


def recorded(instance) -> list:
    return api.compensations_of(api.Subject("govflow.instance", str(instance.pk)))


@pytest.fixture
def operator(django_user_model):
    return user_with(
        django_user_model, "olga", "engine.operate_instance", "recovery.request_decision"
    )


def charged(tenant: str = "north", name: str = "alpha.charge", on=("operator",)):
    """An instance whose first step charged (compensated only when someone starts it)."""
    document = linear(action("charge", name, title="Charge the fee", compensate_on=list(on)), WAIT)
    return drive(start(document, tenant=tenant))


def cancelled(operator, **kw):
    instance = charged(**kw)
    instance_cancel(instance_id=instance.pk, actor=operator, reason="The applicant withdrew.")
    return instance


def test_starting_records_the_compensations_and_the_list_shows_them_run(keys, operator):
    client = keys(scopes=READ_START)
    instance = cancelled(operator)
    assert client.get(url(instance)).json()["compensations"] == []
    response = client.post(url(instance), {}, format="json")
    assert response.status_code == 201, response.content
    assert response["Location"].endswith(url(instance))
    [row] = response.json()["compensations"]
    assert row["order"] == 1 and row["key"].startswith("cmp-")
    assert row["undoes"]["step"] == "charge" and row["undoes"]["step_title"] == "Charge the fee"
    assert row["undoes"]["action"] == "alpha.charge" and row["action"] == "alpha.undo"
    assert (row["state"], row["trigger"], row["approval"]) == ("prepared", "operator", "automatic")
    assert row["open_decision"] is None and not row["awaiting_approval"]
    assert response.json()["desk_url"].endswith(
        f"/admin/engine/instance/{instance.pk}/change/#compensations-heading"
    )
    drive(instance)
    [row] = client.get(url(instance)).json()["compensations"]
    assert (row["state"], row["state_text"]) == ("succeeded", "done")
    assert "input" not in row and set(row) >= {"input_fp", "preview_fp", "idempotency_fp"}


def test_one_that_needs_approval_shows_the_decision_awaiting_a_second_person(keys, operator):
    client = keys(scopes=READ_START)
    instance = cancelled(operator, name="alpha.charge_checked")
    [row] = client.post(url(instance), {}, format="json").json()["compensations"]
    assert row["awaiting_approval"] and row["state_text"].startswith("awaiting approval")
    decision = compensation_request_run(
        instance_id=instance.pk, key=row["key"], actor=operator, rationale="Refund the fee."
    )
    [row] = client.get(url(instance)).json()["compensations"]
    assert row["open_decision"]["id"] == decision.pk
    assert (row["open_decision"]["kind"], row["open_decision"]["requested_by"]) == (
        "compensate",
        "olga",
    )
    assert row["state"] == "prepared"  # not run: the second person approves on the desk


def test_a_second_start_is_a_409_and_records_nothing_more(keys, operator):
    client = keys(scopes=READ_START)
    instance = cancelled(operator)
    assert client.post(url(instance), {}, format="json").status_code == 201
    problem = assert_problem(client.post(url(instance), {}, format="json"), 409, "conflict")
    assert "no succeeded step left to compensate" in problem["detail"]
    assert len(recorded(instance)) == 1


def test_an_instance_that_has_not_ended_is_a_409(keys):
    instance = charged()
    problem = assert_problem(
        keys(scopes=READ_START).post(url(instance), {}, format="json"), 409, "conflict"
    )
    assert "Cancel it first" in problem["detail"]
    assert recorded(instance) == []


def test_the_same_idempotency_key_replays_the_first_answer(keys, operator):
    client = keys(scopes=READ_START)
    instance = cancelled(operator)
    first = client.post(url(instance), {}, format="json", HTTP_IDEMPOTENCY_KEY="start-1")
    again = client.post(url(instance), {}, format="json", HTTP_IDEMPOTENCY_KEY="start-1")
    assert (first.status_code, again.status_code) == (201, 201)
    assert again["Idempotent-Replayed"] == "true" and again.json() == first.json()
    assert len(recorded(instance)) == 1


def test_without_credentials_it_is_a_401(anon_client, operator):
    instance = cancelled(operator)
    assert_problem(anon_client.get(url(instance)), 401, "not-authenticated")
    assert_problem(anon_client.post(url(instance), {}, format="json"), 401, "not-authenticated")
    assert recorded(instance) == []


def test_each_operation_needs_its_scope(keys, operator):
    instance = cancelled(operator)
    others = [s for s in ALL_SCOPES if not s.startswith("compensations:")]
    problem = assert_problem(keys(scopes=others).get(url(instance)), 403, "permission-denied")
    assert "compensations:read" in problem["detail"]
    reader = keys(scopes=["compensations:read"])
    problem = assert_problem(
        reader.post(url(instance), {}, format="json"), 403, "permission-denied"
    )
    assert "compensations:start" in problem["detail"]
    assert recorded(instance) == []
    # Starting compensations does not let a key cancel.
    running = charged()
    assert_problem(
        keys(scopes=READ_START).post(
            f"/api/v1/instances/{running.pk}/cancel/", {"reason": "x"}, format="json"
        ),
        403,
        "permission-denied",
    )


def test_another_tenants_instance_is_a_404_and_nothing_is_recorded(keys, operator):
    theirs = cancelled(operator, tenant="south")
    client = keys(tenant="north", scopes=READ_START)
    assert_problem(client.get(url(theirs)), 404, "not-found")
    assert_problem(client.post(url(theirs), {}, format="json"), 404, "not-found")
    assert_problem(client.get("/api/v1/instances/999999/compensations/"), 404, "not-found")
    assert recorded(theirs) == []


def test_an_unreadable_body_is_a_400_and_a_list_body_a_422(keys, operator):
    client = keys(scopes=READ_START)
    instance = cancelled(operator)
    bad = client.generic("POST", url(instance), b"{bad", content_type="application/json")
    assert_problem(bad, 400, "malformed-request")
    assert_problem(client.post(url(instance), [1], format="json"), 422, "validation-failed")
    assert recorded(instance) == []


def test_a_signed_in_user_needs_the_operate_permission_to_start_them(
    client, operator, django_user_model
):
    instance = cancelled(operator)
    viewer = user_with(django_user_model, "vera", "engine.view_instance")
    verified_login(client, viewer)
    assert client.get(url(instance)).status_code == 200
    problem = assert_problem(
        client.post(url(instance), {}, content_type="application/json"), 403, "permission-denied"
    )
    assert "engine.operate_instance" in problem["detail"]
    verified_login(client, operator)
    response = client.post(url(instance), {}, content_type="application/json")
    assert response.status_code == 201, response.content
    assert [row["state"] for row in response.json()["compensations"]] == ["prepared"]
