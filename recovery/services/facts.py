"""Facts of the caller's own: checkpoints on a subject's chain that move no operation.

The ledger appends its own facts (``operation.*``, ``decision.*``). A caller may record
its own decisions on the same chain, so they are covered by the same keyed links: an
engine records, say, that an operator moved an instance to a provider's changed contract.
Such a fact is linked like any other and verified with the chain, but never replayed as
an operation transition.

The recovery desk's own work goes on chains of its own: an incident's resolution cannot be
recorded on the chain the incident is about (that chain did not verify, and a fact
appended after a broken link proves nothing), so each incident keeps a trail, the subject
``recovery.incident:<id>`` (:func:`incident_trail`), verified by ``recovery_verify`` like
any other. Its ``incident.*`` kinds are the core's own, like ``operation.*`` and
``decision.*``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.db import connection

from .. import chain
from ..canonical import canonical_bytes
from ..db import atomic
from ..errors import RecoveryValidationError
from ..models import Checkpoint
from ..subjects import Subject

__all__ = ["INCIDENT_TRAIL", "fact_append", "facts_read", "incident_fact_append", "incident_trail"]

# Namespaced like "engine.contract_migrated"; the ledger's own namespaces are reserved.
KIND = re.compile(r"^[a-z][a-z0-9_]*\.[a-z][a-z0-9_.]*\Z")
RESERVED = ("operation.", "decision.", "incident.", "compensation.")
INCIDENT_TRAIL = "recovery.incident"


def _check_kind(kind: str, *, own: bool = False) -> None:
    if not isinstance(kind, str) or not KIND.match(kind) or len(kind) > 40:
        raise RecoveryValidationError(
            f"A fact kind is a namespaced name of at most 40 characters, such as "
            f"'engine.contract_migrated', not {kind!r}."
        )
    if not own and kind.startswith(RESERVED):
        raise RecoveryValidationError(
            f"Fact kinds starting with {' or '.join(RESERVED)} are the ledger's own; "
            f"choose your own namespace for {kind!r}."
        )


def fact_append(*, subject: Subject, kind: str, fact: dict[str, Any]) -> int:
    """Append ``fact`` to ``subject``'s chain; return its position (the new revision).

    ``fact`` is a JSON object of fingerprints, ids, states and numbers: no raw input,
    output or credential (invariant I1). It may not carry an ``operation`` key (the chain
    would replay it as an operation's transition). Runs in the caller's transaction (or
    its own). Raises :class:`~recovery.errors.ChainConflict` if another writer appended
    first: nothing was recorded, try again.
    """
    _check_kind(kind)
    return _append(subject, kind, fact)


def _append(subject: Subject, kind: str, fact: dict[str, Any]) -> int:
    if not isinstance(fact, dict):
        raise RecoveryValidationError("A fact is a JSON object.")
    if "operation" in fact:
        raise RecoveryValidationError(
            "A fact of your own may not name an 'operation': operation facts are written "
            "by the ledger's services only."
        )
    canonical_bytes(fact)  # refuses non-JSON values, naming the path
    with atomic(), connection.cursor() as cursor:
        head = chain.append(cursor, subject, chain.read_head(cursor, subject), kind, fact)
    return head.seq


def incident_trail(incident_id: int) -> Subject:
    """The subject whose chain records what was done about incident ``incident_id``."""
    return Subject(INCIDENT_TRAIL, str(incident_id))


def incident_fact_append(*, incident_id: int, kind: str, fact: dict[str, Any]) -> int:
    """Append an ``incident.*`` fact to the incident's trail (the core's own services only)."""
    _check_kind(kind, own=True)
    if not kind.startswith("incident."):
        raise RecoveryValidationError(
            f"An incident's trail records incident.* facts, not {kind!r}."
        )
    return _append(incident_trail(incident_id), kind, fact)


def facts_read(*, subject: Subject, kind: str) -> list[dict[str, Any]]:
    """The facts of ``kind`` on ``subject``'s chain, oldest first.

    A read of the stored rows: it does not verify the chain. A caller that acts on them
    verifies the chain first (:func:`~recovery.chain.chain_verify`). The ledger's own
    kinds may be read too (only writing them is reserved).
    """
    _check_kind(kind, own=True)
    rows = Checkpoint.objects.filter(
        subject_type=subject.type, subject_id=subject.id, kind=kind
    ).order_by("seq")
    return [json.loads(fact) for fact in rows.values_list("fact", flat=True)]
