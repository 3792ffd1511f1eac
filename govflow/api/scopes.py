"""What an API key may do: scopes, and the model permission each means for a signed-in user.

A key carries a list of scopes and acts for one tenant. A user signed in to the admin (session
authentication, for the browser) has no scopes: each scope is checked as the Django model
permission beside it, and such a user acts for their tenants, as in the admin (ADR 0018).

``tasks:<topic>`` lets a key fetch, lock and report on the external tasks of one topic
(``/api/v1/tasks/…``); a signed-in user needs ``engine.change_externaltask`` for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# scope → (the permission a signed-in user needs instead, what it allows)
SCOPES: dict[str, tuple[str, str]] = {
    "definitions:read": (
        "engine.view_definition",
        "List and read published definitions; validate a document without publishing it.",
    ),
    "definitions:publish": (
        "engine.publish_definition",
        "Publish definitions (an administrator's scope: every tenant runs them).",
    ),
    "instances:start": ("engine.start_instance", "Start instances for the key's tenant."),
    "instances:read": ("engine.view_instance", "List and read the tenant's instances."),
    "instances:cancel": ("engine.operate_instance", "Cancel the tenant's instances."),
    "triggers:deliver": (
        "engine.add_triggerdelivery",
        "Deliver messages to waiting instances and read the deliveries made.",
    ),
    "handoffs:read": (
        "engine.view_instance",
        "List and read handoffs: steps waiting for an operator or a provider.",
    ),
    "audit:read": (
        "recovery.view_checkpoint",
        "Read an instance's ledger and checkpoint chain, verify it, export the audit trail.",
    ),
    "compensations:read": (
        "engine.view_instance",
        "List an instance's compensations and where each stands.",
    ),
    "compensations:start": (
        "engine.operate_instance",
        "Start the compensations of the tenant's cancelled or failed instances (running "
        "one that needs approval stays with two people on the desk).",
    ),
    "webhooks:manage": (
        "events.change_subscription",
        "Register, read, pause and resume the tenant's webhook subscriptions; rotate their "
        "secrets.",
    ),
}
TASK_PERMISSION = "engine.change_externaltask"
TASK_SCOPE = re.compile(r"^tasks:[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z")

# The engine's permissions an API key holds through its scopes (the services check
# ``actor.has_perm``; a key's actor answers from its scopes). Each view checks its own
# scope first, so a key with compensations:start still cannot cancel (instances:cancel).
PERMISSION_SCOPES = {
    "engine.start_instance": {"instances:start"},
    "engine.operate_instance": {"instances:cancel", "compensations:start"},
    "engine.publish_definition": {"definitions:publish"},
}


def scope_problem(scope: object) -> str:
    """Why ``scope`` is not a scope a key can hold, or ''."""
    if not isinstance(scope, str):
        return f"{scope!r} is not a scope name."
    if scope in SCOPES or TASK_SCOPE.match(scope):
        return ""
    return (
        f"{scope!r} is not a scope. Scopes are {', '.join(sorted(SCOPES))}, and "
        "tasks:<topic> (a topic of letters, digits, '.', '_' and '-')."
    )


@dataclass(frozen=True)
class KeyActor:
    """An API key as the ``actor`` of a service that only asks permissions and a name.

    Services that store their actor as a user (``started_by``, ``published_by``) are given
    ``None`` for a key instead: the API has checked the scope already.
    """

    name: str
    prefix: str
    scopes: frozenset[str]

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False

    @property
    def pk(self) -> str:
        return f"api-key:{self.prefix}"

    def has_perm(self, perm: str, obj=None) -> bool:
        return bool(PERMISSION_SCOPES.get(perm, set()) & self.scopes)

    def has_perms(self, perms, obj=None) -> bool:
        return all(self.has_perm(p) for p in perms)

    def get_username(self) -> str:
        return self.pk

    def __str__(self) -> str:
        return f"API key {self.name!r} ({self.prefix})"
