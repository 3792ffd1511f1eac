"""Helpers for the engine's integration tests (``tests/integration/test_engine_*.py``).

Readers of a failing test want what an operator would look at: the instance, its tokens,
its ledger operations and whether its chain verifies. These helpers fetch exactly that.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db.models.functions import Now

from govflow.engine.models import Incident, Instance, Token
from govflow.engine.services.definitions import definition_publish
from recovery import api
from recovery.models import Operation
from tests.dbclock import wait_until_expired
from tests.providers.alpha import actions as alpha
from tests.tenancy import bind_tenants

_keys = itertools.count(1)


def graph(
    nodes: list[dict[str, Any]],
    transitions: list[tuple],
    *,
    key: str | None = None,
    version: int = 1,
    **extra: Any,
) -> dict[str, Any]:
    """A definition from nodes and ``(from, to[, when-or-"default"])`` tuples."""
    items = []
    for source, target, *rest in transitions:
        item: dict[str, Any] = {"from": source, "to": target}
        if rest == ["default"]:
            item["default"] = True
        elif rest:
            item["when"] = rest[0]
        items.append(item)
    return {
        "key": key or f"tests.graph{next(_keys)}",
        "version": version,
        "title": "Graph",
        "nodes": nodes,
        "transitions": items,
        **extra,
    }


def node(node_id: str, kind: str, **fields: Any) -> dict[str, Any]:
    return {"id": node_id, "type": kind, **fields}


def split_into(*branches: str) -> dict[str, Any]:
    """start, a parallel split into one ``alpha.write`` action per branch, each to the end."""
    from tests.flows import action

    return graph(
        [
            node("s", "start"),
            node("split", "parallel_split"),
            *(action(branch) for branch in branches),
            node("e", "end"),
        ],
        [("s", "split"), *(("split", b) for b in branches), *((b, "e") for b in branches)],
    )


def subject(instance: Instance) -> api.Subject:
    return api.Subject("govflow.instance", str(instance.pk))


def as_if_the_engine_wrote_it(instance: Instance) -> None:
    """Record the instance's stored rows in its chain, as an engine commit would have.

    For tests that reach a state a crash could leave by editing rows directly: without
    this, the edit is (rightly) an integrity incident (invariant I12).
    """
    from govflow.engine.projection import stored_projection

    api.projection_record(
        subject=subject(instance), projection_fp=stored_projection(str(instance.pk))
    )


def chain_ok(instance: Instance) -> bool:
    return api.chain_verify(subject(instance)).ok


def operations(instance: Instance) -> list[Operation]:
    return list(
        Operation.objects.filter(
            subject_type="govflow.instance", subject_id=str(instance.pk)
        ).order_by("pk")
    )


def op_states(instance: Instance) -> list[str]:
    return [op.state for op in operations(instance)]


def token_of(instance: Instance, node_id: str) -> Token:
    return Token.objects.get(instance=instance, node_id=node_id)


def token_states(instance: Instance) -> dict[str, str]:
    return dict(
        Token.objects.filter(instance=instance).order_by("ordinal").values_list("node_id", "state")
    )


def incidents(instance: Instance) -> list[tuple[str, str]]:
    return list(
        Incident.objects.filter(instance=instance).order_by("pk").values_list("kind", "message")
    )


def make_due(token: Token) -> None:
    """Pretend the backoff or poll delay has passed (the database clock moved on)."""
    Token.objects.filter(pk=token.pk).update(not_before=Now())


def publish(document: dict[str, Any]):
    return definition_publish(document=document)


def evidence(
    name: str = "store-lookup.txt", text: str = "Looked the key up in the alpha store."
) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, text.encode(), content_type="text/plain")


def user_with(django_user_model, username: str, *perms: str):
    """A staff user holding ``app_label.codename`` permissions (fresh permission cache)."""
    user = django_user_model.objects.create_user(username=username, password="pw", is_staff=True)
    bind_tenants(user)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return django_user_model.objects.get(pk=user.pk)


def take_over(key: str, *, holder: str = "worker-2", ttl: float = 30) -> api.Fence:
    """Wait until the lease on ``key`` expires (database clock), then take it over."""
    wait_until_expired(key)
    return api.lease_acquire(key=key, holder=holder, ttl=ttl)


def alpha_write(**changes: Any):
    """``alpha.write`` with some fields changed (for ``registry.override``)."""
    return dataclasses.replace(alpha.write, **changes)


def counted(base=None, **changes: Any):
    """``base`` (default ``alpha.write``) with execute/poll wrapped to count calls.

    Returns ``(action, calls)``; ``calls`` lists ``(phase, attempt, poll)`` per call. The
    alpha store only counts calls that reached the effect, this counts every call.
    """
    base = base or alpha.write
    calls: list[tuple[str, int, int]] = []

    def wrap(fn):
        def called(context):
            calls.append((context.phase, context.attempt, context.poll))
            return fn(context)

        return called

    poll = changes.pop("poll", base.poll)
    return dataclasses.replace(
        base, execute=wrap(base.execute), poll=wrap(poll) if poll else None, **changes
    ), calls


def unmark_all() -> None:
    """Forget every runnable mark (ADR 0026), as if every instance had been run."""
    Instance.objects.update(runnable_at=None)


def marked_runnable() -> list[int]:
    """The instances marked runnable: what a worker's next claim takes (ADR 0026)."""
    marked = Instance.objects.filter(runnable_at__isnull=False).order_by("pk")
    return list(marked.values_list("pk", flat=True))
