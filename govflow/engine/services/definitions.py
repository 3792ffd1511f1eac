"""Publishing definitions: validate, freeze, fingerprint; and re-hashing them at run time.

A published definition is pinned twice: its document, and the contract of every action it
uses as the providers declared it then (:mod:`govflow.engine.contracts`). Its fingerprint
covers both. A run re-hashes the stored bytes (:func:`instance_pinned`) and compares them
with the instance's pin, and compares the pinned contracts with the registry
(:func:`pinned_contracts_refusal`): a definition changed in the database, or an action
changed by a provider's release, stops the instance with the reason, before anything is
dispatched. ``docs/adr/0008-definitions-pinned-with-their-actions.md`` says why.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.apps import apps
from django.db import IntegrityError, connection, transaction

from recovery.api import (
    CanonicalError,
    Subject,
    canonical_bytes,
    incident_report,
    input_guard,
    parse_json,
)

from ..contracts import (
    action_contract,
    contract_changes,
    contracts_of,
    pinned_fingerprint,
    stored_fingerprint,
)
from ..db import clock
from ..definitions import DefinitionInvalid, Spec, parse_definition
from ..errors import DefinitionConflict, InvalidRequest
from ..limits import admit_text, definition_max_bytes
from ..models import Definition, Instance
from ..registry import registry
from .migrated import approved_contracts

__all__ = [
    "Pinned",
    "contract_drift",
    "definition_publish",
    "definitions_drifted",
    "definitions_load_app_workflows",
    "definitions_unresolved",
    "instance_pinned",
    "integrity_problem",
    "pinned_contracts_refusal",
    "pinned_definition_refusal",
    "spec_of",
    "start_refusal",
    "trusted_spec",
]


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
    contracts = contracts_of(spec.actions(), registry.get)
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


def _stored(body: str) -> Any:
    """A stored document, read back. One published before the input guard existed may be
    nested too deeply to read: it is then invalid, never a server error."""
    try:
        return json.loads(body)
    except RecursionError:
        raise DefinitionInvalid(
            ["the stored document is nested too deeply to read; publish a flatter version."]
        ) from None


@functools.lru_cache(maxsize=256)
def _spec(fingerprint: str, body: str) -> Spec:
    return parse_definition(_stored(body))


# What a run of a definition whose stored bytes no longer match its fingerprint reads.
_NOTHING = Spec(document={}, nodes={}, outgoing={}, incoming={}, start="")


@dataclass(frozen=True)
class Pinned:
    """A published definition as a run loaded it, re-hashed from its stored bytes."""

    definition: Definition
    spec: Spec
    fingerprint: str
    """The hash of the stored document and contracts: the ledger records this one."""


def instance_pinned(
    instance_id: int, extra: Sequence[tuple[str, str, list[Any]]] = ()
) -> tuple[Instance, Pinned] | None:
    """Read an instance with its definition's stored bytes (one statement) and re-hash them.

    The definition's document, contracts and fingerprint are read in the same statement
    as the instance, on every run, so a row changed in the database is seen at once. The
    hash is computed once per distinct stored content (cached): an unchanged definition
    costs no hashing and no query. ``extra`` adds scalar subqueries to the same statement,
    as ``(sql, attribute name, params)``; their values are set on the instance.
    """
    quote = connection.ops.quote_name
    columns = "".join(f", {sql} AS {name}" for sql, name, _ in extra)
    params = [p for _, _, extra_params in extra for p in extra_params]
    instance = next(
        iter(
            Instance.objects.raw(
                f"SELECT i.*, d.fingerprint AS pinned_fingerprint, "
                f"d.document AS pinned_document, d.contracts AS pinned_contracts{columns} "
                f"FROM {quote(Instance._meta.db_table)} i "
                f"JOIN {quote(Definition._meta.db_table)} d ON d.id = i.definition_id "
                "WHERE i.id = %s",
                [*params, instance_id],
            )
        ),
        None,
    )
    if instance is None:
        return None
    pinned = _pinned(
        instance.definition_id,
        instance.pinned_fingerprint,
        instance.pinned_document,
        instance.pinned_contracts,
    )
    instance.definition = pinned.definition
    return instance, pinned


@functools.lru_cache(maxsize=256)
def _pinned(definition_id: int, fingerprint: str, document: str, contracts: str) -> Pinned:
    # Keyed by the stored texts themselves: a changed row is another key, hashed afresh.
    definition = Definition.objects.get(pk=definition_id)
    computed = stored_fingerprint(definition.document, definition.contracts)
    # Nothing of a changed document is read, not even to parse it: the run refuses it.
    spec = spec_of(definition) if computed == definition.fingerprint else _NOTHING
    return Pinned(definition, spec, computed)


def integrity_problem(definition: Definition) -> str:
    """Why a stored definition no longer matches its own fingerprint, or ''."""
    computed = stored_fingerprint(definition.document, definition.contracts)
    if computed == definition.fingerprint:
        return ""
    return (
        f"the stored definition {definition} no longer matches the fingerprint it was "
        f"published with: changed in the database after publishing (published as "
        f"{definition.fingerprint[:12]}…, its stored bytes hash to {computed[:12]}…)"
    )


def pinned_definition_refusal(run) -> tuple[str, str] | None:
    """Why ``run`` must not proceed on its definition, as (incident kind, reason), or None.

    The definition's stored bytes must hash to the fingerprint the instance was pinned to
    when it started. Either way of breaking that — the stored document or contracts
    changed, or the instance's pin changed — is an integrity incident on the instance, and
    nothing runs on it.
    """
    instance = run.instance
    if run.definition_fp == instance.definition_fp:
        return None
    problem = integrity_problem(instance.definition)
    if problem:
        reason = f"The definition cannot be trusted: {problem}."
    else:
        reason = (
            f"The definition cannot be trusted: instance {instance.pk} is pinned to "
            f"definition fingerprint {instance.definition_fp[:12]}…, but its definition "
            f"{instance.definition} hashes to {run.definition_fp[:12]}…: the instance's "
            "pin or the definition was changed in the database."
        )
    reason += (
        " Nothing runs on it. Restore the stored definition (and the instance's pin) from "
        "the published file or a backup, then re-verify the integrity incident; or cancel "
        "the instance."
    )
    incident_report(subject=_subject(instance), reason=reason)
    return "definition_changed", reason


def _subject(instance: Instance) -> Subject:
    from ..projection import SUBJECT_TYPE

    return Subject(SUBJECT_TYPE, str(instance.pk))


def trusted_spec(definition: Definition) -> Spec:
    """:func:`spec_of`, or an empty spec when the stored row no longer matches its fingerprint.

    For pages that show an instance: nothing of a document changed in the database is
    shown as if it were the published one (nor can a document that no longer parses break
    the page).
    """
    return _NOTHING if integrity_problem(definition) else spec_of(definition)


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
        parse_definition(_stored(body), registry=registry)
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


def contract_drift(definition: Definition, migrated: str = "") -> list[str]:
    """What changed in the actions ``definition`` pinned, one line per action ([] if none).

    ``migrated`` is an instance's own contracts (canonical JSON), which replace the
    definition's for the actions an operator migrated it to. Actions no provider registers
    any more are not listed here: :func:`unresolved_reason` reports them. Cached per
    stored content and set of registered actions (every run asks).
    """
    return list(_drift(definition.contracts, migrated, registry.generation))


@functools.lru_cache(maxsize=1024)
def _drift(contracts: str, migrated: str, generation: int) -> tuple[str, ...]:
    if not contracts:
        return ()  # published before contracts were pinned: nothing to compare
    pinned = json.loads(contracts) | (json.loads(migrated) if migrated else {})
    changes = []
    for name, contract in sorted(pinned.items()):
        action = registry.get(name)
        if action is not None:
            change = contract_changes(name, contract, action_contract(action))
            if change:
                changes.append(change)
    return tuple(changes)


def pinned_contracts_refusal(run) -> tuple[str, str] | None:
    """Why ``run`` must wait for an operator because a provider changed an action, or None.

    Compares the contracts the instance is pinned to (its definition's, or those an
    approved migration moved it to) with the registry's. An instance's own contracts that
    do not match the approved migrations on its chain are an integrity incident.
    """
    instance = run.instance
    if instance.contracts:
        problem = _migrations_problem(instance)
        if problem:
            incident_report(subject=_subject(instance), reason=problem)
            return "definition_changed", problem
    changes = contract_drift(instance.definition, instance.contracts)
    if not changes:
        return None
    return "contract_changed", (
        f"A provider changed what {instance.definition} was published with: "
        f"{'; '.join(changes)}. Nothing is dispatched under a contract the instance was not "
        "started with: an operator with engine.migrate_instance requests a migration to the "
        "current contract on this page and a second person approves it, or the instance is "
        "cancelled. New instances need a new version of the definition."
    )


class _Untrusted(Exception):
    pass


def _migrations_problem(instance: Instance) -> str:
    try:
        _migrations_verified(instance.pk, instance.created_at, instance.contracts)
    except _Untrusted as exc:
        return str(exc)
    return ""


@functools.lru_cache(maxsize=1024)
def _migrations_verified(instance_id: int, created_at, migrated: str) -> None:
    """Check ``migrated`` against the approved migrations on the instance's chain.

    Once per instance and stored content: only a success is cached (a failure raises), so
    a repaired instance is trusted again as soon as it verifies.
    """
    problem = approved_contracts(instance_id, migrated)
    if problem:
        raise _Untrusted(problem)


def start_refusal(definition: Definition) -> str:
    """Why a new instance of ``definition`` must not start here, or ''."""
    problem = integrity_problem(definition)
    if problem:
        return f"{problem}; restore it from the published file or a backup"
    reason = unresolved_reason(definition)
    if reason:
        return reason
    changes = contract_drift(definition)
    if changes:
        return (
            f"a provider changed what it was published with: {'; '.join(changes)}. "
            f"Publish the document as a new version to start instances under the current "
            "providers."
        )
    return ""


def definitions_drifted() -> list[tuple[str, int, str]]:
    """Published definitions whose stored bytes or pinned contracts no longer match."""
    found = []
    for definition in Definition.objects.order_by("key", "version"):
        problem = integrity_problem(definition)
        if problem:
            found.append((definition.key, definition.version, problem))
            continue
        changes = contract_drift(definition)
        if changes:
            found.append((definition.key, definition.version, "; ".join(changes)))
    return found
