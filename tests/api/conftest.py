"""Fixtures for the REST API tests: keys per tenant and scope, clients, a few instances."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from govflow.api.models import ApiKey
from govflow.api.scopes import SCOPES
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from tests.flows import action, linear

ALL_SCOPES = sorted(SCOPES)


@pytest.fixture(autouse=True)
def fresh_throttle_counts():
    """Rate-limit counts live in the cache: every test starts with none."""
    cache.clear()
    yield
    cache.clear()


def make_key(tenant: str = "north", scopes=ALL_SCOPES, name: str = "test integration", **kw):
    key, raw = ApiKey.objects.create_key(name=name, tenant=tenant, scopes=list(scopes), **kw)
    return key, raw


def client_with(raw_key: str | None = None) -> APIClient:
    client = APIClient()
    if raw_key:
        client.credentials(HTTP_AUTHORIZATION=f"Api-Key {raw_key}")
    return client


@pytest.fixture
def key_client(db):
    """A client authenticated with a key of tenant 'north' holding every scope."""
    _, raw = make_key()
    return client_with(raw)


@pytest.fixture
def anon_client():
    return APIClient()


@pytest.fixture
def keys(db):
    """``keys(tenant=…, scopes=…)`` → an authenticated client."""

    def build(tenant: str = "north", scopes=ALL_SCOPES, **kw) -> APIClient:
        return client_with(make_key(tenant, scopes, **kw)[1])

    return build


def waiting_document(key: str = "tests.api_wait", version: int = 1, **extra) -> dict:
    """start → a trigger wait on 'ref' → end: an instance that stays put, waiting."""
    document = linear(
        {
            "id": "wait",
            "type": "trigger",
            "title": "Wait for the report",
            "message": "report.ready",
            "correlation": "ref",
        },
        key=key,
        version=version,
        variables_schema={
            "type": "object",
            "required": ["ref"],
            "properties": {
                "ref": {"type": "string"},
                "applicant": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                },
            },
        },
    )
    document.update(extra)
    return document


@pytest.fixture
def waiting_definition(db):
    return definition_publish(document=waiting_document())


@pytest.fixture
def action_definition(db):
    return definition_publish(document=linear(action("a"), key="tests.api_action", version=1))


def start_instance(definition, tenant: str = "north", **variables):
    variables = variables or {"ref": f"R-{tenant}"}
    return instance_start(definition=definition, variables=variables, tenant=tenant)


def assert_problem(response, status: int, code: str):
    """The response is an RFC 9457 problem of this status and type."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/problem+json"), response["Content-Type"]
    body = response.json()
    assert body["status"] == status
    assert body["code"] == code
    assert body["type"] == f"/api/v1/problems/{code}/"
    assert body["title"] and body["detail"]
    return body


class World:
    """Two tenants' worth of things to ask for: ``north`` (the keys' tenant) and ``south``."""

    def __init__(self, **ids):
        self.__dict__.update(ids)

    def fill(self, path: str, tenant: str = "north") -> str:
        return path.format(
            instance=getattr(self, f"{tenant}_instance"),
            handoff=getattr(self, f"{tenant}_handoff"),
            delivery=getattr(self, f"{tenant}_delivery"),
        )


@pytest.fixture
def world(db, waiting_definition):
    """Per tenant: an instance waiting for a message, a step of unknown outcome (a
    handoff), and a delivered message."""
    from govflow.engine.models import TokenState
    from govflow.engine.services.triggers import trigger_deliver
    from tests.engine_helpers import token_of
    from tests.flows import drive, start
    from tests.providers.alpha import effects

    ids = {}
    for index, tenant in enumerate(("north", "south")):
        waiting = drive(start_instance(waiting_definition, tenant=tenant, ref=f"R-{tenant}"))
        effects.SCRIPT["alpha.write"] = ["raise_after"]
        uncertain = drive(
            start(
                linear(action("a"), key=f"tests.api_uncertain_{tenant}", version=1),
                tenant=tenant,
            )
        )
        token = token_of(uncertain, "a")
        assert token.state == TokenState.OUTCOME_UNKNOWN
        trigger_deliver(
            message="other.message",
            correlation=f"C-{index}",
            delivery_id=f"{tenant}:D-{tenant}",
            payload={},
        )
        ids.update(
            {
                f"{tenant}_instance": waiting.pk,
                f"{tenant}_uncertain": uncertain.pk,
                f"{tenant}_handoff": token.pk,
                f"{tenant}_delivery": f"D-{tenant}",
            }
        )
    return World(**ids)


START_BODY = {"definition": "tests.api_wait", "variables": {"ref": "R-new"}}
DELIVERY_BODY = {
    "message": "report.ready",
    "correlation": "R-none",
    "delivery_id": "new-delivery-1",
    "payload": {"ok": True},
}

# Every endpoint that needs a credential: (method, path, scope, body).
ENDPOINTS = [
    ("get", "/api/v1/definitions/", "definitions:read", None),
    ("post", "/api/v1/definitions/", "definitions:publish", waiting_document(version=2)),
    ("post", "/api/v1/definitions/validate/", "definitions:read", waiting_document(version=2)),
    ("get", "/api/v1/definitions/tests.api_wait/", "definitions:read", None),
    ("get", "/api/v1/definitions/tests.api_wait/1/", "definitions:read", None),
    ("get", "/api/v1/instances/", "instances:read", None),
    ("post", "/api/v1/instances/", "instances:start", START_BODY),
    ("get", "/api/v1/instances/{instance}/", "instances:read", None),
    ("post", "/api/v1/instances/{instance}/cancel/", "instances:cancel", {"reason": "Withdrawn"}),
    ("get", "/api/v1/instances/{instance}/ledger/", "audit:read", None),
    ("get", "/api/v1/instances/{instance}/chain/", "audit:read", None),
    ("get", "/api/v1/instances/{instance}/chain/verify/", "audit:read", None),
    ("get", "/api/v1/instances/{instance}/audit/", "audit:read", None),
    ("post", "/api/v1/triggers/deliveries/", "triggers:deliver", DELIVERY_BODY),
    ("get", "/api/v1/triggers/deliveries/{delivery}/", "triggers:deliver", None),
    ("get", "/api/v1/handoffs/", "handoffs:read", None),
    ("get", "/api/v1/handoffs/{handoff}/", "handoffs:read", None),
]
OBJECT_ENDPOINTS = [e for e in ENDPOINTS if "{" in e[1]]


def call(client: APIClient, method: str, path: str, body=None, **extra):
    if method == "get":
        return client.get(path, **extra)
    return client.post(path, body if body is not None else {}, format="json", **extra)
