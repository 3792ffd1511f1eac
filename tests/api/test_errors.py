"""Every error under /api/ is a problem (RFC 9457), and no input makes a 500."""

from __future__ import annotations

import io
import json

import pytest
from django.test import RequestFactory

from govflow.api import problems
from govflow.api.parsers import JSONParser
from govflow.api.problems import ApiProblem
from govflow.engine.models import Instance

from .conftest import assert_problem, make_key

pytestmark = pytest.mark.django_db

START = "/api/v1/instances/"


def post_raw(client, body: bytes | str, content_type: str = "application/json", **extra):
    return client.generic("POST", START, body, content_type=content_type, **extra)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{bad", "$: not JSON: Expecting property name"),
        (b'{"definition": "a", "definition": "b"}', "the key 'definition' appears twice"),
        (b'{"variables": {"x": NaN}}', "$.variables.x: NaN is not a JSON number"),
        (b'{"variables": {"x": 1e999}}', "$.variables.x: inf is not a finite number"),
        (b'{"variables": {"x": ' + b"1" * 5000 + b"}}", "5000 digits is too long to read"),
        (b'{"variables": {"x": 12345678901234567890}}', "outside \u00b1(2**53 - 1)"),
        (b'{"variables": {"x": "a\\u0000b"}}', "$.variables.x: string contains U+0000"),
        (b'{"variables": {"a\\u0000": 1}}', "string contains U+0000"),
        (b'{"variables": {"x": "\\ud800"}}', "lone surrogate U+D800"),
        (b'{"definition": "\xff\xfe"}', "the text is not UTF-8"),
        (b"[" * 100 + b"]" * 100, "nested deeper than 64 levels"),
        (b"[" * 200_000 + b"]" * 200_000, "nested deeper than 64 levels"),
    ],
)
def test_unreadable_bodies_are_400_and_change_nothing(key_client, waiting_definition, body, words):
    problem = assert_problem(post_raw(key_client, body), 400, "malformed-request")
    assert words in problem["detail"]
    assert problem["instance"] == START
    assert Instance.objects.count() == 0


def test_a_body_that_is_not_json_is_415(key_client, waiting_definition):
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "application/xml"):
        problem = assert_problem(
            post_raw(key_client, "definition=x", content_type), 415, "unsupported-media-type"
        )
        assert "Content-Type: application/json" in problem["detail"]
    assert Instance.objects.count() == 0


def test_a_body_over_the_limit_is_413_before_it_is_read(key_client, settings, monkeypatch):
    settings.GOVFLOW_API_MAX_BODY_BYTES = 1000
    read = []
    monkeypatch.setattr(JSONParser, "parse", lambda *a, **k: read.append(1))
    problem = assert_problem(post_raw(key_client, b" " * 1001), 413, "payload-too-large")
    assert "over 1000 bytes" in problem["detail"]
    assert read == []
    # Before authentication too: an anonymous giant body is not read either.
    from rest_framework.test import APIClient

    assert_problem(post_raw(APIClient(), b" " * 1001), 413, "payload-too-large")


def test_the_parser_stops_reading_at_the_limit(settings):
    settings.GOVFLOW_API_MAX_BODY_BYTES = 10
    with pytest.raises(ApiProblem) as raised:
        JSONParser().parse(io.BytesIO(b"[" + b"1," * 100 + b"1]"))
    assert raised.value.status_code == 413


def test_an_unknown_url_under_the_api_is_a_404_problem_for_any_method(key_client, anon_client):
    for client in (key_client, anon_client):
        for method in ("get", "post", "delete", "put"):
            response = getattr(client, method)("/api/v1/no/such/thing/")
            assert_problem(response, 404, "not-found")
    problem = assert_problem(key_client.get("/api/v1/instances"), 404, "not-found")
    assert "Did you mean /api/v1/instances/ ?" in problem["detail"]
    # The external-task paths exist now (issue 11 part 4); below them, nothing else does.
    assert_problem(key_client.post("/api/v1/tasks/no-such/", {}), 404, "not-found")


def test_outside_the_api_django_pages_stay_as_they_were(client):
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert not response["Content-Type"].startswith("application/problem+json")


def test_a_wrong_method_is_405_with_allow(key_client):
    response = key_client.delete("/api/v1/instances/")
    assert_problem(response, 405, "method-not-allowed")
    assert response["Allow"] == "GET, POST, HEAD"
    assert_problem(key_client.options("/api/v1/instances/"), 405, "method-not-allowed")


def test_an_unacceptable_accept_header_is_406(key_client):
    response = key_client.get("/api/v1/instances/", HTTP_ACCEPT="application/xml")
    assert_problem(response, 406, "not-acceptable")


def test_an_unexpected_error_is_a_logged_500_problem(key_client, monkeypatch, caplog, settings):
    from govflow.api import selectors

    def broken(tenant):
        raise RuntimeError("a bug")

    monkeypatch.setattr(selectors, "instances", broken)
    for debug in (False, True):
        settings.DEBUG = debug
        problem = assert_problem(key_client.get(START), 500, "server-error")
        assert "a bug" not in problem["detail"]
    assert "Unhandled error answering /api/v1/instances/" in caplog.text


def test_djangos_handlers_answer_problems_under_the_api_only():
    factory = RequestFactory()
    for handler, status in (
        (problems.handler400, 400),
        (problems.handler403, 403),
        (problems.handler404, 404),
    ):
        api = handler(factory.get("/api/v1/x/"), Exception())
        assert api.status_code == status
        assert api["Content-Type"] == "application/problem+json"
        assert json.loads(api.content)["status"] == status
        page = handler(factory.get("/admin/x/"), Exception())
        assert page["Content-Type"].startswith("text/html")
    api = problems.handler500(factory.get("/api/v1/x/"))
    assert (api.status_code, json.loads(api.content)["code"]) == (500, "server-error")
    assert problems.handler500(factory.get("/x/"))["Content-Type"].startswith("text/html")


def test_too_many_requests_are_429_with_retry_after_per_key(settings, key_client):
    settings.GOVFLOW_API_RATE = "3/min"
    for _ in range(3):
        assert key_client.get("/api/v1/me/").status_code == 200
    response = key_client.get("/api/v1/me/")
    problem = assert_problem(response, 429, "rate-limited")
    assert 1 <= int(response["Retry-After"]) <= 60
    assert response["Retry-After"] in problem["detail"]
    # Another key has its own bucket.
    from .conftest import client_with

    assert client_with(make_key(name="other")[1]).get("/api/v1/me/").status_code == 200


def test_anonymous_calls_have_their_own_rate(settings, anon_client):
    settings.GOVFLOW_API_ANON_RATE = "2/min"
    assert anon_client.get("/api/v1/problems/").status_code == 200
    assert anon_client.get("/api/v1/problems/").status_code == 200
    assert_problem(anon_client.get("/api/v1/problems/"), 429, "rate-limited")


def test_the_problem_catalogue_describes_every_type(anon_client):
    listed = anon_client.get("/api/v1/problems/").json()
    assert {p["code"] for p in listed} == set(problems.PROBLEM_TYPES)
    for entry in listed:
        one = anon_client.get(entry["type"])
        assert one.status_code == 200 and one.json() == entry
    assert_problem(anon_client.get("/api/v1/problems/no-such-problem/"), 404, "not-found")
