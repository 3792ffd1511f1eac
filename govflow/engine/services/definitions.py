"""Publishing definitions: validate, freeze, fingerprint."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from django.apps import apps
from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from recovery.api import canonical_bytes

from ..definitions import DefinitionInvalid, Spec, definition_fingerprint, parse_definition
from ..errors import DefinitionConflict, InvalidRequest
from ..models import Definition
from ..registry import registry

__all__ = [
    "definition_publish",
    "definitions_load_app_workflows",
    "definitions_unresolved",
    "spec_of",
]


def definition_publish(*, document: Any, source: str = "", actor=None) -> Definition:
    """Validate and publish ``document`` as a frozen version.

    Publishing the same bytes again returns the existing row; different bytes under an
    existing key and version raise :class:`DefinitionConflict` (publish a new version).
    Raises :class:`DefinitionInvalid` listing every problem.
    """
    if actor is not None and not actor.has_perm("engine.publish_definition"):
        raise InvalidRequest(f"{actor} may not publish definitions (engine.publish_definition).")
    parse_definition(document, registry=registry)
    body = canonical_bytes(document).decode()
    fp = definition_fingerprint(document)
    existing = Definition.objects.filter(key=document["key"], version=document["version"]).first()
    if existing is not None:
        if existing.fingerprint == fp:
            return existing
        raise DefinitionConflict(
            f"{document['key']} v{document['version']} is already published with different "
            "content. A published version never changes: publish it as version "
            f"{_next_version(document['key'])}."
        )
    try:
        with transaction.atomic():
            return Definition.objects.create(
                key=document["key"],
                version=document["version"],
                title=document["title"],
                document=body,
                fingerprint=fp,
                source=source[:300],
                published_at=Now(),
                published_by=actor,
            )
    except IntegrityError:
        # Published concurrently: identical content is the same definition.
        existing = Definition.objects.get(key=document["key"], version=document["version"])
        if existing.fingerprint != fp:
            raise DefinitionConflict(
                f"{document['key']} v{document['version']} was published "
                "concurrently with different content."
            ) from None
        return existing


def _next_version(key: str) -> int:
    latest = Definition.objects.filter(key=key).order_by("-version").first()
    return (latest.version if latest else 0) + 1


def definition_load_file(path: Path, *, actor=None) -> Definition:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DefinitionInvalid([f"{path.name}: not readable JSON ({exc})."]) from None
    try:
        return definition_publish(document=document, source=str(path.name), actor=actor)
    except DefinitionInvalid as exc:
        raise DefinitionInvalid([f"{path.name}: {p}" for p in exc.problems]) from None


def app_workflow_files() -> Iterable[Path]:
    """Every ``workflows/*.json`` shipped by an installed app, in a stable order."""
    files = []
    for config in apps.get_app_configs():
        folder = Path(config.path) / "workflows"
        if folder.is_dir():
            files.extend(sorted(folder.glob("*.json")))
    return sorted(files, key=lambda p: (p.parent.as_posix(), p.name))


def definitions_load_app_workflows(*, actor=None) -> list[Definition]:
    return [definition_load_file(path, actor=actor) for path in app_workflow_files()]


@functools.lru_cache(maxsize=256)
def _spec(fingerprint: str, body: str) -> Spec:
    return parse_definition(json.loads(body))


def definition_pinned(definition_id: int, fingerprint: str) -> Definition:
    """The published definition an instance pins, cached (a published row never changes).

    Cached by id and fingerprint together, so a row that is not the pinned version (a
    test database reusing ids) is read again, not served from the cache.
    """
    definition = _definition(definition_id, fingerprint)
    if definition.fingerprint != fingerprint:
        _definition.cache_clear()
        definition = Definition.objects.get(pk=definition_id)
    return definition


@functools.lru_cache(maxsize=256)
def _definition(definition_id: int, fingerprint: str) -> Definition:
    return Definition.objects.get(pk=definition_id)


def spec_of(definition: Definition) -> Spec:
    """The parsed structure of a published definition (cached by fingerprint)."""
    return _spec(definition.fingerprint, definition.document)


def unresolved_reason(definition: Definition) -> str:
    """Why a published definition cannot run here, or '' when it resolves.

    Cached per definition and set of registered actions (every run asks).
    """
    return _unresolved(definition.fingerprint, definition.document, registry.generation)


@functools.lru_cache(maxsize=256)
def _unresolved(fingerprint: str, body: str, generation: int) -> str:
    try:
        parse_definition(json.loads(body), registry=registry)
    except DefinitionInvalid as exc:
        return "; ".join(exc.problems)
    return ""


def definitions_unresolved() -> list[tuple[str, int, str]]:
    broken = []
    for definition in Definition.objects.order_by("key", "version"):
        reason = unresolved_reason(definition)
        if reason:
            broken.append((definition.key, definition.version, reason))
    return broken
