"""Subjects: what a checkpoint chain and its ledger operations are about."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db.models import Q

from .errors import RecoveryValidationError


@dataclass(frozen=True, order=True)
class Subject:
    """A generic subject, such as ``Subject("govflow.instance", "42")``."""

    type: str
    id: str

    def __post_init__(self) -> None:
        for name, value in (("type", self.type), ("id", self.id)):
            if not isinstance(value, str) or not value or len(value) > 100:
                raise RecoveryValidationError(
                    f"A subject {name} must be a string of 1-100 characters, not {value!r}."
                )

    @classmethod
    def parse(cls, text: str) -> Subject:
        """Parse ``"type:id"`` (the form ``recovery_verify --subject`` takes)."""
        kind, sep, ident = text.partition(":")
        if not sep:
            raise RecoveryValidationError(
                f"{text!r} is not a subject; write it as type:id, e.g. govflow.instance:42."
            )
        return cls(kind, ident)

    def __str__(self) -> str:
        return f"{self.type}:{self.id}"


LEDGER_WATERMARK = Subject("recovery.ledger", "watermark")
"""The ledger as a whole: an incident on it (the database is behind its anchors, rolled
back or restored from an older backup) stops every new effect, whatever its subject."""


@dataclass(frozen=True)
class SubjectType:
    """What the host application tells the recovery core about one kind of subject.

    ``url`` returns the host's page of a subject (the incident's admin page links to it);
    ``resolve_approve``, when given, replaces
    :func:`recovery.services.incidents.incident_resolve_approve` for incidents on this kind
    of subject, with the same keyword arguments (``incident_id``, ``actor``) and result, so
    the host can act in the same commit (the engine re-queues the instance). The recovery
    admin and ``recovery_verify --approve`` approve through it.
    """

    name: str
    label: str
    url: Callable[[Subject], str | None] | None = None
    resolve_approve: Callable[..., Any] | None = None
    visible: Callable[[Any], Any] | None = None
    """``visible(user)``: the ids of the subjects of this type ``user`` may see, as a
    subquery of strings (e.g. ``.values("sid")``), or None for every one. Without it, every
    user who may see the records sees every subject of the type."""


class SubjectTypes:
    """The registry of :class:`SubjectType`: registered once, by the app that owns the type.

    Register from an ``AppConfig.ready()``; a second registration of the same name is an
    error (two apps claiming one subject type). Tests use :meth:`override`.
    """

    def __init__(self) -> None:
        self._types: dict[str, SubjectType] = {}

    def register(
        self,
        name: str,
        *,
        label: str,
        url: Callable[[Subject], str | None] | None = None,
        resolve_approve: Callable[..., Any] | None = None,
        visible: Callable[[Any], Any] | None = None,
    ) -> SubjectType:
        if not isinstance(name, str) or not name or len(name) > 100:
            raise RecoveryValidationError(
                f"A subject type must be a string of 1-100 characters, not {name!r}."
            )
        if name in self._types:
            raise RecoveryValidationError(
                f"Subject type {name!r} is already registered; each type has one owner."
            )
        kind = SubjectType(name, label, url, resolve_approve, visible)
        self._types[name] = kind
        return kind

    def get(self, name: str) -> SubjectType | None:
        return self._types.get(name)

    def visible_to(self, user) -> dict[str, Any] | None:
        """The subject types whose subjects ``user`` may see only some of, each with the
        subquery of those ids; None when ``user`` may see every subject."""
        narrowed = {}
        for kind in self._types.values():
            ids = kind.visible(user) if kind.visible else None
            if ids is not None:
                narrowed[kind.name] = ids
        return narrowed or None

    def url_of(self, subject: Subject) -> str | None:
        """The host's page of ``subject``, or None when its type registered none."""
        kind = self._types.get(subject.type)
        return kind.url(subject) if kind and kind.url else None

    @contextmanager
    def override(self, kind: SubjectType) -> Iterator[SubjectType]:
        """Register ``kind`` (replacing any registration of its name) for a ``with`` block."""
        previous = self._types.get(kind.name)
        self._types[kind.name] = kind
        try:
            yield kind
        finally:
            if previous is None:
                self._types.pop(kind.name, None)
            else:
                self._types[kind.name] = previous


subject_types = SubjectTypes()


def subject_type_register(
    name: str,
    *,
    label: str,
    url: Callable[[Subject], str | None] | None = None,
    resolve_approve: Callable[..., Any] | None = None,
    visible: Callable[[Any], Any] | None = None,
) -> SubjectType:
    """Register a kind of subject with the recovery core (see :class:`SubjectType`)."""
    return subject_types.register(
        name, label=label, url=url, resolve_approve=resolve_approve, visible=visible
    )


def subjects_visible(user, type_field: str, id_field: str) -> Q | None:
    """A filter on ``type_field``/``id_field`` for the subjects ``user`` may see (a host
    narrows its subject types with ``visible``, e.g. to the user's tenants); None: all."""
    narrowed = subject_types.visible_to(user)
    if narrowed is None:
        return None
    shown = ~Q(**{f"{type_field}__in": list(narrowed)})
    for name, ids in narrowed.items():
        shown |= Q(**{type_field: name, f"{id_field}__in": ids})
    return shown
