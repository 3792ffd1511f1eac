"""Definitions through the API: list, read, validate without publishing, publish."""

from __future__ import annotations

import pytest

from govflow.engine.models import Definition
from tests.flows import action, linear
from tests.identity import verified_login

from .conftest import assert_problem, waiting_document

pytestmark = pytest.mark.django_db


def test_list_and_read_published_versions(key_client, waiting_definition):
    from govflow.engine.services.definitions import definition_publish

    second = definition_publish(document=waiting_document(version=2, title="Second"))
    listed = key_client.get("/api/v1/definitions/?key=tests.api_wait").json()["results"]
    assert [(d["key"], d["version"]) for d in listed] == [
        ("tests.api_wait", 2),
        ("tests.api_wait", 1),
    ]
    assert listed[0]["url"] == "http://testserver/api/v1/definitions/tests.api_wait/2/"
    latest = key_client.get("/api/v1/definitions/tests.api_wait/").json()
    assert (latest["version"], latest["title"], latest["versions"]) == (2, "Second", [1, 2])
    assert latest["fingerprint"] == second.fingerprint
    assert latest["runnable"] is True and latest["not_runnable_because"] == ""
    assert latest["variables_schema"]["required"] == ["ref"]
    assert latest["document"]["nodes"][1]["id"] == "wait"
    first = key_client.get("/api/v1/definitions/tests.api_wait/1/").json()
    assert first["version"] == 1
    assert_problem(key_client.get("/api/v1/definitions/tests.api_wait/3/"), 404, "not-found")
    assert_problem(key_client.get("/api/v1/definitions/tests.nothing/"), 404, "not-found")


def test_a_definition_shows_its_pinned_contracts(key_client):
    from govflow.engine.services.definitions import definition_publish

    definition_publish(document=linear(action("a"), key="tests.api_action", version=1))
    body = key_client.get("/api/v1/definitions/tests.api_action/1/").json()
    assert body["contracts"]["alpha.write"]["mode"] == "non_atomic"


def test_validate_reports_every_problem_and_publishes_nothing(key_client):
    document = waiting_document(key="tests.api_new")
    document["nodes"].append({"id": "orphan", "type": "action", "action": "no.such_action"})
    response = key_client.post("/api/v1/definitions/validate/", document, format="json")
    problem = assert_problem(response, 422, "validation-failed")
    details = [e["detail"] for e in problem["errors"]]
    assert any("no.such_action" in d for d in details)
    assert any("orphan" in d for d in details)
    assert not Definition.objects.filter(key="tests.api_new").exists()


def test_validate_says_what_publishing_would_do(key_client, waiting_definition):
    def check(document):
        return key_client.post("/api/v1/definitions/validate/", document, format="json")

    same = check(waiting_document())
    assert same.json() == {
        "key": "tests.api_wait",
        "version": 1,
        "fingerprint": waiting_definition.fingerprint,
        "published": "identical",
    }
    assert check(waiting_document(title="Changed")).json()["published"] == "conflict"
    assert check(waiting_document(version=2)).json()["published"] == "no"
    assert_problem(check(["not", "an", "object"]), 422, "validation-failed")
    problem = assert_problem(
        check({"key": "a.b", "version": 2**40, "title": "t", "nodes": [], "transitions": []}),
        422,
        "validation-failed",
    )
    assert {
        "field": "",
        "detail": "'version' must be a positive integer (at most 2147483647).",
    } in (problem["errors"])
    empty = key_client.generic("POST", "/api/v1/definitions/validate/", b"", "application/json")
    assert_problem(empty, 400, "malformed-request")
    assert Definition.objects.count() == 1


def test_publish_creates_a_version_and_publishing_it_again_returns_it(key_client):
    document = waiting_document(key="tests.api_pub")
    first = key_client.post("/api/v1/definitions/", document, format="json")
    assert first.status_code == 201, first.json()
    assert first["Location"] == "http://testserver/api/v1/definitions/tests.api_pub/1/"
    definition = Definition.objects.get(key="tests.api_pub")
    assert definition.published_by is None
    assert definition.source == "REST API, API key 'test integration' (" + definition.source[-9:]
    again = key_client.post("/api/v1/definitions/", document, format="json")
    assert again.status_code == 200
    assert again.json()["fingerprint"] == first.json()["fingerprint"]
    assert Definition.objects.filter(key="tests.api_pub").count() == 1


def test_publish_of_changed_content_under_a_published_version_is_409(
    key_client, waiting_definition
):
    response = key_client.post(
        "/api/v1/definitions/", waiting_document(title="Changed"), format="json"
    )
    problem = assert_problem(response, 409, "conflict")
    assert "publish it as version 2" in problem["detail"]
    assert Definition.objects.count() == 1


def test_publish_of_an_invalid_document_is_422_listing_every_problem(key_client):
    document = {"key": "Bad Key", "version": 0, "title": "", "nodes": [], "transitions": []}
    problem = assert_problem(
        key_client.post("/api/v1/definitions/", document, format="json"), 422, "validation-failed"
    )
    details = [e["detail"] for e in problem["errors"]]
    assert any("'key' must be" in d for d in details)
    assert any("'version' must be" in d for d in details)
    assert any("'nodes' must be" in d for d in details)
    assert Definition.objects.count() == 0


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"key": "tests." + "k" * 120}, "at most 120 characters"),
        ({"title": "t" * 201}, "'title' must be a non-empty string of at most 200"),
        ({"version": 2**31}, "'version' must be a positive integer (at most 2147483647)"),
    ],
)
def test_publish_refuses_what_the_columns_cannot_hold(key_client, change, words):
    document = {**waiting_document(key="tests.api_long"), **change}
    problem = assert_problem(
        key_client.post("/api/v1/definitions/", document, format="json"), 422, "validation-failed"
    )
    assert words in problem["detail"]
    assert Definition.objects.count() == 0


def test_a_signed_in_user_publishes_as_themselves(django_user_model):
    from tests.engine_helpers import user_with

    from .conftest import client_with

    user = user_with(django_user_model, "author", "engine.publish_definition")
    client = client_with()
    client.force_login(user)  # password only: a publisher needs a second factor to write
    refused = client.post(
        "/api/v1/definitions/", waiting_document(key="tests.api_me"), format="json"
    )
    assert refused.status_code == 403
    assert "needs a second factor verified in this login" in refused.json()["detail"]
    assert not Definition.objects.filter(key="tests.api_me").exists()

    verified_login(client, user)
    response = client.post(
        "/api/v1/definitions/", waiting_document(key="tests.api_me"), format="json"
    )
    assert response.status_code == 201, response.json()
    assert Definition.objects.get(key="tests.api_me").published_by == user


def test_a_definition_changed_in_the_database_reads_as_not_runnable(key_client, waiting_definition):
    Definition.objects.filter(pk=waiting_definition.pk).update(document="{not json")
    body = key_client.get("/api/v1/definitions/tests.api_wait/1/").json()
    assert body["runnable"] is False
    assert "no longer matches the fingerprint it was published with" in body["not_runnable_because"]
    assert body["document"] == {} and body["variables_schema"] is None


def test_a_variables_pattern_that_can_backtrack_forever_is_refused_at_publish(key_client):

    schema = {
        "type": "object",
        "properties": {"ref": {"type": "string", "pattern": "^(?!X)[A-Z]+$"}},
    }
    document = linear(action("a"), key="tests.lookahead", version=1, variables_schema=schema)
    problem = assert_problem(
        key_client.post("/api/v1/definitions/", document, format="json"), 422, "validation-failed"
    )
    details = " ".join(e["detail"] for e in problem["errors"])
    assert "'^(?!X)[A-Z]+$' cannot be matched in linear time" in details
    assert Definition.objects.count() == 0
    schema["properties"]["ref"]["pattern"] = "^[A-WYZ][A-Z]*$"
    assert key_client.post("/api/v1/definitions/", document, format="json").status_code == 201


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"key": "tests.nl\n"}, "'key' must be"),
        ({"nodes_0_id": "start\n"}, "id"),
        ({"trigger": {"message": "m" * 201}}, "1 to 200 printable characters"),
        ({"trigger": {"message": "line\nbreak"}}, "1 to 200 printable characters"),
        ({"trigger": {"correlation": "ref." + "9" * 5000}}, "'correlation' must be"),
        ({"approval": {"permission": "engine." + "p" * 300}}, "each part at most 100"),
    ],
    ids=["key-newline", "node-newline", "long-message", "message-newline", "long-path", "perm"],
)
def test_a_document_no_step_could_serve_is_refused_before_anything_is_stored(
    key_client, change, words
):
    from tests.engine_helpers import node

    nodes = [action("a")]
    if "trigger" in change:
        nodes.append(
            node("w", "trigger", **{"message": "m", "correlation": "ref", **change.pop("trigger")})
        )
    if "approval" in change:
        nodes.append(node("p", "approval", **change.pop("approval")))
    document = linear(*nodes, key="tests.hostile", version=1)
    if "nodes_0_id" in change:
        old = document["nodes"][0]["id"]
        document["nodes"][0]["id"] = change.pop("nodes_0_id")
        for t in document["transitions"]:
            t["from"] = document["nodes"][0]["id"] if t["from"] == old else t["from"]
    document.update(change)
    response = key_client.post("/api/v1/definitions/", document, format="json")
    problem = assert_problem(response, 422, "validation-failed")
    assert words in " ".join(e["detail"] for e in problem["errors"]), problem
    assert Definition.objects.count() == 0
    assert key_client.get("/api/v1/definitions/").status_code == 200


@pytest.mark.parametrize("schema", [False, True, 5, "object"])
def test_variables_that_are_not_a_schema_object_are_refused_not_ignored(key_client, schema):
    document = linear(action("a"), key="tests.variables", version=1, variables_schema=None)
    document["variables"] = schema
    problem = assert_problem(
        key_client.post("/api/v1/definitions/", document, format="json"), 422, "validation-failed"
    )
    assert "'variables' must be a JSON Schema object" in " ".join(
        e["detail"] for e in problem["errors"]
    )
    assert Definition.objects.count() == 0
