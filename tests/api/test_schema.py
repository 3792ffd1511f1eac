"""The OpenAPI document and its viewers, served from the packages (no CDN)."""

from __future__ import annotations

import re

import pytest
from drf_spectacular.validation import validate_schema

pytestmark = pytest.mark.django_db


def test_the_schema_is_valid_openapi_3_1_and_documents_every_error(anon_client):
    response = anon_client.get("/api/v1/schema/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/vnd.oai.openapi+json")
    schema = response.json()
    assert schema["openapi"] == "3.1.0"
    validate_schema(schema)  # raises on any deviation from the OpenAPI 3.1 JSON Schema
    assert schema["components"]["securitySchemes"]["ApiKeyAuth"] == {
        "type": "apiKey",
        "in": "header",
        "name": "Authorization",
        "description": schema["components"]["securitySchemes"]["ApiKeyAuth"]["description"],
    }
    operations = [
        (path, method, op) for path, item in schema["paths"].items() for method, op in item.items()
    ]
    assert len(operations) >= 19
    for path, method, op in operations:
        assert path.startswith("/api/v1/") and path.endswith("/")
        problem = op["responses"]["default"]["content"]["application/problem+json"]
        assert problem["schema"] == {"$ref": "#/components/schemas/Problem"}, (path, method)
        if op.get("security") != [{}]:
            for status in ("401", "403", "404", "429"):
                assert status in op["responses"], (path, method, status)
        if method == "post" and op.get("security") != [{}]:
            for status in ("409", "413", "415", "422", "423"):
                assert status in op["responses"], (path, method, status)
    changing = [op for _, method, op in operations if method == "post"]
    with_key = [
        op
        for op in changing
        if any(p["name"] == "Idempotency-Key" for p in op.get("parameters", []))
    ]
    # Every POST that creates or changes something takes an Idempotency-Key.
    assert {op["operationId"] for op in with_key} == {
        "definitions_publish",
        "instances_start",
        "instances_cancel",
        "instances_compensations_start",
        "triggers_deliver",
        "tasks_fetch_and_lock",
        "tasks_extend_lock",
        "tasks_complete",
        "tasks_fail",
        "tasks_bpmn_error",
        "webhooks_create",
        "webhooks_activate",
        "webhooks_deactivate",
        "webhooks_rotate_secret",
    }


def test_yaml_on_request(anon_client):
    response = anon_client.get("/api/v1/schema/", HTTP_ACCEPT="application/yaml")
    assert response.status_code == 200
    assert response.content.startswith(b"openapi: 3.1.0")


@pytest.mark.parametrize("page", ["/api/v1/docs/", "/api/v1/redoc/"])
def test_the_viewers_load_their_assets_from_this_server(anon_client, page):
    response = anon_client.get(page)
    assert response.status_code == 200
    html = response.content.decode()
    assert "/api/v1/schema/" in html
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sources and all(s.startswith("/static/") or s.startswith("/api/") for s in sources), (
        sources
    )
    assert "cdn." not in html and "jsdelivr" not in html and "unpkg" not in html


def test_the_schema_states_the_limits_the_server_enforces(anon_client):
    schema = anon_client.get("/api/v1/schema/").json()

    def parameter(path: str, name: str, method: str = "get") -> dict:
        op = schema["paths"][path][method]
        [found] = [p for p in op.get("parameters", []) if p["name"] == name]
        return found["schema"]

    assert parameter("/api/v1/handoffs/", "instance") == {
        "type": "integer",
        "minimum": 1,
        "maximum": 999_999_999_999_999_999,
    }
    assert parameter("/api/v1/instances/", "definition_version") == {
        "type": "integer",
        "minimum": 1,
        "maximum": 2_147_483_647,
    }
    assert parameter("/api/v1/instances/", "definition")["minLength"] == 1
    assert parameter("/api/v1/definitions/", "key") == {
        "type": "string",
        "minLength": 1,
        "maxLength": 120,
    }
    key = parameter("/api/v1/instances/", "Idempotency-Key", "post")
    assert (key["minLength"], key["maxLength"]) == (1, 257)
    assert re.match(key["pattern"], "a1-b2") and re.match(key["pattern"], '"quoted"')
    assert not re.match(key["pattern"], "has space") and not re.match(key["pattern"], "x" * 256)


def test_a_value_that_may_be_null_has_one_schema_that_null_matches_once(anon_client):
    """``oneOf: [{}, {"type": "null"}]`` is matched twice by null, so no null would be valid."""
    schema = anon_client.get("/api/v1/schema/").json()

    def any_value_branches(node, where="") -> list[str]:
        found = []
        if isinstance(node, dict):
            if {} in node.get("oneOf", []):
                found.append(where)
            for key, value in node.items():
                found += any_value_branches(value, f"{where}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                found += any_value_branches(value, f"{where}/{index}")
        return found

    assert any_value_branches(schema) == []
    components = schema["components"]["schemas"]
    assert components["TaskReport"]["properties"]["payload"].get("type") is None
    assert components["DefinitionDetail"]["properties"]["variables_schema"].get("type") is None
