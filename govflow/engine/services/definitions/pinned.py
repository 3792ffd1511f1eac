"""A published definition read back: re-hashed, parsed, and why an instance must not run.

Every check compares stored bytes with what they were pinned to, so a row changed in the
database or an action changed by a provider's release is seen by the next run. The
parsing and hashing are cached by the stored texts themselves (a changed row is another
key), so an unchanged definition costs no hashing and no query.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection

from recovery.api import incident_report, model_columns, rows_as

from ...contracts import action_contract, contract_changes, stored_fingerprint
from ...definitions import DefinitionInvalid, Spec, parse_definition
from ...linked import resolve_action
from ...models import Definition, Instance
from ...projection import instance_subject
from ...registry import registry
from ..migrated import approved_contracts


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


_PINNED = ("pinned_fingerprint", "pinned_document", "pinned_contracts")


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
    sql, params = pinned_select(instance_id, extra)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return pinned_of(rows[0], extra) if rows else None


def pinned_select(
    instance_id: int,
    extra: Sequence[tuple[str, str, list[Any]]] = (),
    *,
    lead: str = "",
    tail: str = "",
) -> tuple[str, list[Any]]:
    """:func:`instance_pinned`'s statement; ``lead`` and ``tail``: select-list items put
    first and last (for a statement that unites it with others of other columns)."""
    quote = connection.ops.quote_name
    instances = quote(Instance._meta.db_table)
    columns = "".join(f", {sql} AS {name}" for sql, name, _ in extra)
    params = [p for _, _, extra_params in extra for p in extra_params]
    # The definition by a key read first (a sub-select), not by a join: each row is then
    # found by its primary key whatever the tables' statistics say. Joined, on statistics
    # taken when the tables were small, the planner scanned an index of every instance
    # for this one (ADR 0065).
    return (
        f"SELECT {lead}{model_columns(Instance, 'i')}, d.fingerprint, d.document, "
        f"d.contracts{columns}{tail} "
        f"FROM {instances} i, {quote(Definition._meta.db_table)} d "
        f"WHERE i.id = %s AND d.id = (SELECT definition_id FROM {instances} WHERE id = %s)",
        [*params, instance_id, instance_id],
    )


def pinned_width(extra: Sequence[tuple[str, str, list[Any]]] = ()) -> int:
    """How many columns :func:`pinned_select` selects, ``lead`` and ``tail`` not counted."""
    return len(Instance._meta.concrete_fields) + len(_PINNED) + len(extra)


def pinned_of(
    row: Sequence[Any], extra: Sequence[tuple[str, str, list[Any]]] = ()
) -> tuple[Instance, Pinned]:
    """The instance and its re-hashed definition from a row :func:`pinned_select` read."""
    names = (*_PINNED, *(name for _, name, _ in extra))
    [instance] = rows_as(Instance, [row], names)
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
    incident_report(subject=instance_subject(instance.pk), reason=reason)
    return "definition_changed", reason


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
    """Published definitions that cannot run here: (key, version, why), by key and version."""
    return _each_problem(unresolved_reason)


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
        action = resolve_action(name)
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
            incident_report(subject=instance_subject(instance.pk), reason=problem)
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
    return _each_problem(
        lambda definition: integrity_problem(definition) or "; ".join(contract_drift(definition))
    )


def _each_problem(problem_of: Callable[[Definition], str]) -> list[tuple[str, int, str]]:
    """(key, version, problem) of every published definition with one, by key and version."""
    found = []
    for definition in Definition.objects.order_by("key", "version"):
        problem = problem_of(definition)
        if problem:
            found.append((definition.key, definition.version, problem))
    return found
