"""A query parameter an endpoint does not take is a 400 naming it, and nothing is done.

A misspelt filter (``?statuss=waiting``) used to be dropped silently: the answer was the
unfiltered list, which looks like an answer. What each endpoint takes is what its OpenAPI
operation documents; the first test holds the two together.
"""

from __future__ import annotations

import pytest
from drf_spectacular.generators import EndpointEnumerator, SchemaGenerator

from govflow.engine.models import Instance
from govflow.engine.services.triggers import trigger_deliver

from .conftest import (
    ENDPOINTS,
    START_BODY,
    assert_problem,
    call,
)

pytestmark = pytest.mark.django_db


def test_every_operation_takes_exactly_the_query_parameters_it_documents():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    checked = 0
    for path, _, method, callback in EndpointEnumerator().get_api_endpoints():
        view = callback.cls()
        if not hasattr(view, "accepted_query"):  # the schema document and its pages
            continue
        # drf-spectacular names a primary key "id" in the document (SCHEMA_COERCE_PATH_PK).
        operation = schema["paths"][path.replace("{pk}", "{id}")][method.lower()]
        documented = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
        assert view.accepted_query(method) == documented, (method, path)
        checked += 1
    assert checked >= 30  # every operation of the API, not a handful


@pytest.mark.parametrize(("method", "path", "scope", "body"), ENDPOINTS)
def test_an_unknown_query_parameter_is_refused_by_every_endpoint(
    key_client, world, method, path, scope, body
):
    before = (Instance.objects.count(), world.north_instance)
    target = world.fill(path)
    response = call(key_client, method, f"{target}?zz_not_a_parameter=1", body)
    problem = assert_problem(response, 400, "malformed-request")
    assert "'zz_not_a_parameter'" in problem["detail"]
    assert problem["errors"] == [
        {"field": "zz_not_a_parameter", "detail": "not a query parameter of this endpoint"}
    ]
    assert Instance.objects.count() == before[0]
    assert Instance.objects.get(pk=world.north_instance).status == "waiting"


def test_a_misspelt_filter_is_named_with_the_filters_the_list_takes(key_client, world):
    response = key_client.get("/api/v1/instances/?statuss=waiting&Status=running")
    problem = assert_problem(response, 400, "malformed-request")
    assert "'statuss', 'Status'" in problem["detail"]
    assert "status" in problem["detail"] and "var.<path>" in problem["detail"]
    assert [e["field"] for e in problem["errors"]] == ["statuss", "Status"]


def test_documented_parameters_still_work(key_client, world):
    ok = key_client.get("/api/v1/instances/?status=waiting&page_size=5&var.ref=R-north")
    assert ok.status_code == 200, ok.content[:300]
    assert [row["id"] for row in ok.json()["results"]] == [world.north_instance]
    audit = key_client.get(f"/api/v1/instances/{world.north_instance}/audit/?format=jsonl")
    assert audit.status_code == 200
    handoffs = key_client.get(f"/api/v1/handoffs/?instance={world.north_uncertain}")
    assert [row["id"] for row in handoffs.json()["results"]] == [world.north_handoff]


def test_a_write_with_an_unknown_parameter_changes_nothing(key_client, world):
    started = key_client.post("/api/v1/instances/?dry_run=true", START_BODY, format="json")
    assert_problem(started, 400, "malformed-request")
    delivered = key_client.post(
        "/api/v1/triggers/deliveries/?tenant=north",
        {"message": "report.ready", "correlation": "R-north", "delivery_id": "x-1", "payload": {}},
        format="json",
    )
    problem = assert_problem(delivered, 400, "malformed-request")
    assert "takes no query parameters" in problem["detail"]
    assert Instance.objects.get(pk=world.north_instance).status == "waiting"
    # The same delivery without the parameter is taken: the refused one left no trace.
    trigger_deliver(message="noise", correlation="none", delivery_id="north:noise", payload={})
    again = key_client.post(
        "/api/v1/triggers/deliveries/",
        {"message": "report.ready", "correlation": "R-north", "delivery_id": "x-1", "payload": {}},
        format="json",
    )
    assert again.status_code == 202, again.content[:300]


def test_case_variable_filters_only_on_the_list_that_takes_them(key_client, world):
    response = key_client.get("/api/v1/handoffs/?var.ref=R-north")
    problem = assert_problem(response, 400, "malformed-request")
    assert "'var.ref'" in problem["detail"]


def test_without_a_credential_the_answer_is_still_401(anon_client, world):
    response = anon_client.get("/api/v1/instances/?statuss=waiting")
    assert_problem(response, 401, "not-authenticated")


def test_public_endpoints_refuse_unknown_parameters_too(anon_client):
    response = anon_client.get("/api/v1/problems/?lang=de")
    assert_problem(response, 400, "malformed-request")
    assert anon_client.get("/api/v1/problems/").status_code == 200


def test_a_method_the_endpoint_lacks_is_405_whatever_its_query(key_client, world):
    path = f"/api/v1/instances/{world.north_instance}/"
    for method in ("delete", "put", "patch", "options"):
        response = getattr(key_client, method)(f"{path}?x=1")
        assert response.status_code == 405, (method, response.content)
        assert "GET" in response["Allow"]


@pytest.mark.parametrize("value", ["1.5", "1e3", "0", "-1", "abc"])
def test_an_instance_filter_is_a_whole_number_of_an_instance(key_client, world, value):
    response = key_client.get(f"/api/v1/handoffs/?instance={value}")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "malformed-request"


def test_the_handoffs_of_one_instance(key_client, world):
    instance = Instance.objects.get(tokens__pk=world.north_handoff)
    found = key_client.get(f"/api/v1/handoffs/?instance={instance.pk}").json()["results"]
    assert [h["id"] for h in found] == [world.north_handoff]


@pytest.mark.parametrize(
    "query", ["format=jsonl&format=json", "format=", "format=xml"], ids=["twice", "empty", "other"]
)
def test_the_audit_format_is_given_once_with_a_value(key_client, world, query):
    response = key_client.get(f"/api/v1/instances/{world.north_instance}/audit/?{query}")
    assert response.status_code == 400, response.content
    assert "format" in response.json()["detail"]


@pytest.mark.parametrize("query", ["tenant=a&tenant=north", "tenant=", "tenant=" + "t" * 101])
def test_a_deliverys_tenant_is_given_once_with_a_short_value(world, django_user_model, query):
    from tests.engine_helpers import user_with

    from .conftest import client_with

    client = client_with()
    client.force_login(user_with(django_user_model, "reader", "engine.add_triggerdelivery"))
    response = client.get(f"/api/v1/triggers/deliveries/D-north/?{query}")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "malformed-request"


def test_a_path_with_a_line_break_is_the_apis_not_found(key_client):
    from django.urls import resolve

    assert resolve("/api/v1/problems/a\n/").url_name == "not-found"
    response = key_client.get("/api/v1/problems/a%0A/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/problem+json")
