"""Publishing a definition: validated, frozen with its actions' contracts, fingerprinted."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from django.apps import apps
from django.db import IntegrityError, transaction

from recovery.api import CanonicalError, canonical_bytes, input_guard, parse_json

from ...contracts import contract_changes, contracts_of, pinned_fingerprint
from ...db import clock
from ...definitions import DefinitionInvalid, parse_definition
from ...errors import DefinitionConflict, InvalidRequest
from ...limits import admit_text, definition_max_bytes
from ...linked import resolve_action
from ...models import Definition
from ...registry import registry


def definition_publish(*, document: Any, source: str = "", actor=None) -> Definition:
    """Validate and publish ``document`` as a frozen version, its actions' contracts pinned.

    The contract of every action the document uses (recovery mode, verification checks,
    input schema: :mod:`govflow.engine.contracts`) is stored with it, and the fingerprint
    covers both. Publishing the same document again returns the existing row while the
    providers declare the same contracts; different bytes, or the same document under a
    provider whose action changed, raise :class:`DefinitionConflict` (publish a new
    version). Raises :class:`DefinitionInvalid` listing every problem.
    """
    if actor is not None and not actor.has_perm("engine.publish_definition"):
        raise InvalidRequest(f"{actor} may not publish definitions (engine.publish_definition).")
    if isinstance(source, str):
        source = source[:300]
    source = admit_text(source, name="source", max_length=300, required=False)
    try:
        data = input_guard(document, max_bytes=definition_max_bytes())
    except CanonicalError as exc:
        raise DefinitionInvalid([str(exc)]) from None
    spec = parse_definition(document, registry=registry)
    body = data.decode()
    contracts = contracts_of(spec.actions(), resolve_action)
    pinned = canonical_bytes(contracts).decode()
    fp = pinned_fingerprint(document, contracts)
    existing = Definition.objects.filter(key=document["key"], version=document["version"]).first()
    if existing is not None:
        return _published_again(existing, document, body, fp, contracts)
    try:
        with transaction.atomic():
            return Definition.objects.create(
                key=document["key"],
                version=document["version"],
                title=document["title"],
                document=body,
                contracts=pinned,
                fingerprint=fp,
                source=source,
                published_at=clock(),
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


def _published_again(existing: Definition, document, body: str, fp: str, contracts) -> Definition:
    if existing.fingerprint == fp:
        return existing
    if existing.document == body and not existing.contracts:
        # Published before contracts were pinned: the same document is the same row.
        return existing
    name = f"{document['key']} v{document['version']}"
    if existing.document == body:
        before = json.loads(existing.contracts)
        changes = [
            contract_changes(action, before.get(action, {}), contract)
            for action, contract in contracts.items()
        ]
        raise DefinitionConflict(
            f"{name} is already published, pinned to other action contracts than the "
            f"installed providers declare now ({'; '.join(c for c in changes if c)}). A "
            "published version never changes: publish this document as version "
            f"{_next_version(document['key'])} to run new instances under the current "
            f"providers. Instances of {name} stay blocked until an operator migrates them."
        )
    raise DefinitionConflict(
        f"{name} is already published with different content. A published version never "
        f"changes: publish it as version {_next_version(document['key'])}."
    )


def _next_version(key: str) -> int:
    latest = Definition.objects.filter(key=key).order_by("-version").first()
    return (latest.version if latest else 0) + 1


def definition_load_file(path: Path, *, actor=None) -> Definition:
    """Publish one definition file, read with the admin upload's strict parser.

    Refuses, as :class:`DefinitionInvalid` naming the file, what cannot be read, what is
    larger than ``GOVFLOW_DEFINITION_MAX_BYTES``, and text that is not strict JSON
    (duplicate keys, NaN, nesting deeper than the input limit).
    """
    limit = definition_max_bytes()
    try:
        with path.open("rb") as file:
            data = file.read(limit + 1)
    except OSError as exc:
        raise DefinitionInvalid([f"{path.name}: not readable ({exc.strerror or exc})."]) from None
    if len(data) > limit:
        raise DefinitionInvalid(
            [
                f"{path.name}: a definition file may be at most {limit} bytes, and this one "
                "is larger (the limit is GOVFLOW_DEFINITION_MAX_BYTES)."
            ]
        )
    try:
        document = parse_json(data, max_bytes=limit)
    except CanonicalError as exc:
        raise DefinitionInvalid([f"{path.name}: not readable JSON: {exc}"]) from None
    # A file name the file system could not decode carries surrogates: store it readable.
    source = path.name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    try:
        return definition_publish(document=document, source=source, actor=actor)
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
