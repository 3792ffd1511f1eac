"""The rights trail: every change of who may do what, as facts on one keyed chain.

The chain is the subject ``govflow.rights:trail`` in the recovery core's checkpoint table,
linked with the same keyed BLAKE3 as the decisions (``recovery.api.fact_append``), so
``manage.py recovery_verify`` verifies it with every other chain and an edited fact is
reported as a broken chain. One chain for the whole installation keeps the changes in one
order; rights change seldom, so its single head is no bottleneck.

Who made a change is taken from :func:`acting`: the web's middleware names the signed-in
user for the length of a request, the confirmation service the confirming administrator.
A change made with no one acting (a shell, a command, ``createsuperuser``) is recorded with
``by`` null and ``via`` "orm" — never silently.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from recovery.api import Subject, fact_append

SUBJECT_TYPE = "govflow.rights"
TRAIL = Subject(SUBJECT_TYPE, "trail")


@dataclass(frozen=True)
class Acting:
    """Who is changing rights now, how, and (for a confirmation) which request."""

    user: Callable[[], Any] | None = None
    via: str = "orm"
    extra: dict[str, Any] = field(default_factory=dict)

    def actor_pk(self) -> int | None:
        user = self.user() if self.user is not None else None
        if user is None or not getattr(user, "is_authenticated", False):
            return None
        return user.pk


_acting: contextvars.ContextVar[Acting] = contextvars.ContextVar("govflow_rights_acting")


@contextmanager
def acting(user, *, via: str, **extra: Any) -> Iterator[None]:
    """Attribute the rights changes made inside the block to ``user`` (a user, or a
    callable returning one, read only when a change is recorded)."""
    getter = user if callable(user) and not hasattr(user, "pk") else (lambda: user)
    token = _acting.set(Acting(getter, via, extra))
    try:
        yield
    finally:
        _acting.reset(token)


def current() -> Acting:
    return _acting.get(Acting())


def record(kind: str, /, **fact: Any) -> int:
    """Append a ``rights.*`` fact with who, how and when; return its position.

    Runs in the caller's transaction: the fact commits or rolls back with the change.
    """
    now = current()
    full = {
        **fact,
        **now.extra,
        "by": now.actor_pk(),
        "via": now.via,
        "at": timezone.now().isoformat(timespec="seconds"),
    }
    return fact_append(subject=TRAIL, kind=f"rights.{kind}", fact=full)
