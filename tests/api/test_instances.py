"""Instances through the API: start, read with steps in words, list and filter, cancel."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db.models.functions import Now

from govflow.engine.models import Instance, InstanceStatus
from tests.flows import drive

from .conftest import assert_problem, start_instance, waiting_document

pytestmark = pytest.mark.django_db


def test_start_creates_the_instance_for_the_keys_tenant_and_queues_its_run(
    key_client, waiting_definition
):
    response = key_client.post(
        "/api/v1/instances/",
        {"definition": "tests.api_wait", "variables": {"ref": "R-7"}},
        format="json",
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    instance = Instance.objects.get(pk=body["id"])
    assert response["Location"] == f"http://testserver/api/v1/instances/{instance.pk}/"
    assert (instance.tenant, instance.variables, instance.started_by) == (
        "north",
        {"ref": "R-7"},
        None,
    )
    assert instance.access["via"] == "rest-api" and instance.access["api_key"]
    assert body["status"] == "running"
    assert body["definition"] == {
        "key": "tests.api_wait",
        "version": 1,
        "fingerprint": waiting_definition.fingerprint,
    }
    assert [s["node"] for s in body["steps"]] == ["start"]
    # The worker takes it from the queue; it then waits for its message.
    drive(instance)
    detail = key_client.get(f"/api/v1/instances/{instance.pk}/").json()
    assert detail["status"] == "waiting"
    wait = next(s for s in detail["steps"] if s["node"] == "wait")
    assert wait["state"] == "waiting" and wait["waiting_for"] == "trigger"
    assert wait["state_text"] == "waiting for the message 'report.ready'"
    assert wait["title"] == "Wait for the report" and wait["type"] == "trigger"


def test_start_picks_the_version_asked_for_or_the_latest(key_client, waiting_definition):
    from govflow.engine.services.definitions import definition_publish

    definition_publish(document=waiting_document(version=2, title="Second"))
    latest = key_client.post(
        "/api/v1/instances/",
        {"definition": "tests.api_wait", "variables": {"ref": "a"}},
        format="json",
    )
    first = key_client.post(
        "/api/v1/instances/",
        {"definition": "tests.api_wait", "version": 1, "variables": {"ref": "b"}},
        format="json",
    )
    assert latest.json()["definition"]["version"] == 2
    assert first.json()["definition"]["version"] == 1


def test_start_of_an_unknown_definition_is_404_and_starts_nothing(key_client, waiting_definition):
    for body in (
        {"definition": "tests.no_such_flow", "variables": {}},
        {"definition": "tests.api_wait", "version": 9, "variables": {"ref": "x"}},
    ):
        problem = assert_problem(
            key_client.post("/api/v1/instances/", body, format="json"), 404, "not-found"
        )
        assert body["definition"] in problem["detail"]
    assert Instance.objects.count() == 0


@pytest.mark.parametrize(
    ("variables", "field"),
    [
        ({}, "(variables): 'ref' is a required property"),
        ({"ref": 5}, "ref: 5 is not of type 'string'"),
        ({"ref": "x", "applicant": {"name": 3}}, "applicant.name: 3 is not of type 'string'"),
    ],
)
def test_variables_that_fail_the_schema_are_422_naming_the_field(
    key_client, waiting_definition, variables, field
):
    response = key_client.post(
        "/api/v1/instances/",
        {"definition": "tests.api_wait", "variables": variables},
        format="json",
    )
    problem = assert_problem(response, 422, "validation-failed")
    assert field in problem["detail"]
    assert Instance.objects.count() == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"variables": {}}, "definition"),
        ({"definition": "tests.api_wait", "variables": []}, "variables"),
        ({"definition": "tests.api_wait", "version": 0}, "version"),
        ({"definition": "x" * 121}, "definition"),
    ],
)
def test_malformed_start_fields_are_422_listing_each(key_client, waiting_definition, body, field):
    problem = assert_problem(
        key_client.post("/api/v1/instances/", body, format="json"), 422, "validation-failed"
    )
    assert field in [e["field"] for e in problem["errors"]]
    assert Instance.objects.count() == 0


def test_variables_over_the_size_limit_are_refused(key_client, waiting_definition, settings):
    settings.GOVFLOW_VARIABLES_MAX_BYTES = 100
    body = {"definition": "tests.api_wait", "variables": {"ref": "x" * 200}}
    problem = assert_problem(
        key_client.post("/api/v1/instances/", body, format="json"), 422, "validation-failed"
    )
    assert problem["detail"].startswith("Variables are malformed: $.ref: the value grows past")
    assert "the 100 bytes of JSON accepted here" in problem["detail"]


def test_list_filters_by_status_definition_dates_and_case_variables(key_client, waiting_definition):
    nowak = drive(start_instance(waiting_definition, ref="A", applicant={"name": "Nowak"}))
    other = start_instance(waiting_definition, ref="B", applicant={"name": "Kowalska"})
    numbered = start_instance(waiting_definition, ref="C", applicant={"name": "1500"})
    start_instance(waiting_definition, tenant="south", ref="D", applicant={"name": "Nowak"})

    def ids(query: str) -> list[int]:
        response = key_client.get(f"/api/v1/instances/{query}")
        assert response.status_code == 200, response.json()
        return [i["id"] for i in response.json()["results"]]

    assert ids("") == [numbered.pk, other.pk, nowak.pk]  # newest first, own tenant only
    assert ids("?status=waiting") == [nowak.pk]
    assert ids("?status=waiting&status=running") == [numbered.pk, other.pk, nowak.pk]
    assert ids("?definition=tests.api_wait&definition_version=1") == [
        numbered.pk,
        other.pk,
        nowak.pk,
    ]
    assert ids("?definition=tests.other") == []
    assert ids("?var.applicant.name=Nowak") == [nowak.pk]
    assert ids("?var.applicant.name=Nowak&status=running") == []
    assert ids("?var.ref=B") == [other.pk]
    assert ids("?var.applicant.name=1500") == [numbered.pk]  # the string "1500"
    assert ids("?var.applicant.missing=x") == []
    Instance.objects.filter(pk=nowak.pk).update(
        created_at=Now() - dt.timedelta(days=3), updated_at=Now() - dt.timedelta(days=2)
    )
    yesterday = (dt.datetime.now(dt.UTC) - dt.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert ids(f"?created_before={yesterday}") == [nowak.pk]
    assert ids(f"?created_after={yesterday}") == [numbered.pk, other.pk]
    assert ids(f"?updated_before={yesterday}") == [nowak.pk]
    assert ids(f"?updated_after={yesterday}") == [numbered.pk, other.pk]


def test_case_variables_match_the_json_value_they_spell(key_client, waiting_definition):
    from govflow.engine.models import Instance as Model

    instance = start_instance(waiting_definition, ref="A")
    Model.objects.filter(pk=instance.pk).update(
        variables={"ref": "A", "fee": 1500, "paid": True, "note": None}
    )
    for query in ("var.fee=1500", "var.paid=true", "var.note=null"):
        response = key_client.get(f"/api/v1/instances/?{query}")
        assert [i["id"] for i in response.json()["results"]] == [instance.pk], query
    assert key_client.get("/api/v1/instances/?var.fee=1501").json()["results"] == []


@pytest.mark.parametrize(
    "query",
    [
        "status=sleeping",
        "created_after=yesterday",
        "created_after=0001-01-01T00:00:00%2B05:00",
        "definition_version=1.5",
        "var.1bad=x",
        "var.a..b=x",
        "var.a=1&var.a=2",
        "definition=a.b&definition=c.d",
        "status=",
        "var.a.b.c.d.e.f.g.h.i=x",
        "var.a=1&var.b=1&var.c=1&var.d=1&var.e=1&var.f=1",
        "var.a=" + "x" * 201,
        "cursor=not-a-cursor",
        "cursor=cD1hYmM%3D",  # a well-formed cursor at position "abc"
        "cursor=%25%25%25",  # no base64 character: DRF alone read it as the first page
        "cursor=cD0x%25",  # a given-out cursor with a character added
        "cursor=eD0x",  # "x=1": base64, but no field a cursor has
        "cursor=cD0xJnA9Mg%3D%3D",  # "p=1&p=2": a field twice
    ],
)
def test_unreadable_filters_are_400_naming_the_parameter(key_client, waiting_definition, query):
    assert_problem(key_client.get(f"/api/v1/instances/?{query}"), 400, "malformed-request")


def test_pages_follow_next_links_without_repeats(key_client, waiting_definition):
    made = [start_instance(waiting_definition, ref=str(n)).pk for n in range(5)]
    seen, url = [], "/api/v1/instances/?page_size=2"
    while url:
        page = key_client.get(url).json()
        assert len(page["results"]) <= 2
        seen += [i["id"] for i in page["results"]]
        url = page["next"]
    assert seen == sorted(made, reverse=True)


def test_previous_links_lead_back_to_the_same_pages(key_client, waiting_definition):
    made = sorted(start_instance(waiting_definition, ref=str(n)).pk for n in range(5))
    first = key_client.get("/api/v1/instances/?page_size=2").json()
    second = key_client.get(first["next"]).json()
    third = key_client.get(second["next"]).json()
    assert [i["id"] for i in third["results"]] == made[:1]
    back = key_client.get(third["previous"]).json()
    assert back["results"] == second["results"]
    assert key_client.get(back["previous"]).json()["results"] == first["results"]
    # An empty cursor is no cursor: the first page.
    assert key_client.get("/api/v1/instances/?page_size=2&cursor=").json() == first


def test_cancel_with_a_reason_cancels_and_says_who(key_client, waiting_definition):
    instance = drive(start_instance(waiting_definition))
    response = key_client.post(
        f"/api/v1/instances/{instance.pk}/cancel/",
        {"reason": "Withdrawn by the applicant"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "cancelled"
    assert "API key 'test integration'" in body["reason"]
    assert "Withdrawn by the applicant" in body["reason"]
    assert {s["state"] for s in body["steps"]} >= {"cancelled"}
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.CANCELLED


def test_cancel_needs_a_reason_and_an_active_instance(key_client, waiting_definition):
    instance = drive(start_instance(waiting_definition))
    url = f"/api/v1/instances/{instance.pk}/cancel/"
    problem = assert_problem(key_client.post(url, {}, format="json"), 422, "validation-failed")
    assert problem["errors"] == [{"field": "reason", "detail": "This field is required."}]
    assert key_client.post(url, {"reason": "done"}, format="json").status_code == 200
    problem = assert_problem(
        key_client.post(url, {"reason": "again"}, format="json"), 409, "conflict"
    )
    assert problem["detail"] == f"Instance {instance.pk} is already cancelled."


def test_cancel_of_an_unknown_outcome_is_allowed_and_says_what_stays_open(key_client, world):
    # Issue 9: refusing this cancel could deadlock an instance; it is allowed now, and the
    # step whose effect may have happened stays outcome_unknown.
    response = key_client.post(
        f"/api/v1/instances/{world.north_uncertain}/cancel/", {"reason": "stop"}, format="json"
    )
    assert response.status_code == 200, response.content[:500]
    instance = Instance.objects.get(pk=world.north_uncertain)
    assert instance.status == InstanceStatus.CANCELLED
    assert "The outcome of step 'a' is still unknown" in response.json()["reason"]
    assert instance.tokens.get(node_id="a").state == "outcome_unknown"
