"""A subject's audit trail as one JSON document, and verifying such a document offline.

:func:`trail_read` reads a subject's checkpoints, ledger operations, decisions (with the
BLAKE3 fingerprints of their evidence files) and the observations the chain records.
:func:`trail_verify` takes that document back — from a file, with no database — and
re-links the chain with the chain keys from the settings, replays the operations and
compares them, and the decisions' results, with the rows the document carries
(:func:`~recovery.chain.replay.verify_rows`, the same replay the database check uses).

Without the chain key a trail cannot be verified: anyone could recompute unkeyed hashes
after editing a file, which is exactly what the key prevents.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .canonical import CanonicalError, canonical_bytes
from .chain.links import COMPARED, OP_COLUMNS
from .chain.replay import Verification, verify_rows
from .models import Checkpoint, Decision, EvidenceFile, Operation
from .subjects import Subject

TRAIL_FORMAT = "govflow.trail/1"
CHECKPOINT_FIELDS = ("seq", "kind", "fact", "fact_fp", "prev_link", "link", "key_id")
OBSERVED = ("operation.observed", "operation.reconciled")


class TrailUnreadable(ValueError):
    """The document is not a trail this verifier can read (names what is missing)."""


def trail_read(subject: Subject) -> dict[str, Any]:
    """The trail of ``subject``: checkpoints (facts as objects), operations (every column the
    chain replays), decisions with their results and evidence fingerprints, observations."""
    where = {"subject_type": subject.type, "subject_id": subject.id}
    checkpoints = [_checkpoint(cp) for cp in Checkpoint.objects.filter(**where).order_by("seq")]
    operations = list(Operation.objects.filter(**where).order_by("chain_seq", "key"))
    decisions = (
        Decision.objects.filter(
            operation__subject_type=subject.type, operation__subject_id=subject.id
        )
        .select_related("operation")
        .order_by("pk")
    )
    evidence: dict[int, list[dict[str, Any]]] = {}
    for item in EvidenceFile.objects.filter(decision__in=decisions).order_by("pk"):
        evidence.setdefault(item.decision_id, []).append(
            {"name": item.name, "blake3": item.fingerprint, "size": item.size}
        )
    return {
        "format": TRAIL_FORMAT,
        "subject": str(subject),
        "checkpoints": checkpoints,
        "operations": [_operation(op) for op in operations],
        "decisions": [_decision(d, evidence.get(d.pk, [])) for d in decisions],
        "observations": [
            {"seq": cp["seq"], "kind": cp["kind"], **_observed(cp["fact"])}
            for cp in checkpoints
            if cp["kind"] in OBSERVED
        ],
    }


def _checkpoint(cp: Checkpoint) -> dict[str, Any]:
    try:
        fact = json.loads(cp.fact)
    except ValueError:
        fact = cp.fact  # kept as text: the verifier names it as not canonical
    return {
        **{name: getattr(cp, name) for name in CHECKPOINT_FIELDS if name != "fact"},
        "fact": fact,
        "projection_fp": cp.projection_fp,
        "recorded_at": cp.recorded_at.isoformat(),
    }


def _operation(op: Operation) -> dict[str, Any]:
    return {
        **{column: getattr(op, column) for column in OP_COLUMNS},
        "recorded_at": op.recorded_at.isoformat(),
        "updated_at": op.updated_at.isoformat(),
    }


def _decision(decision: Decision, evidence: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": decision.pk,
        "operation": decision.operation.key,
        "kind": decision.kind,
        "state": decision.state,
        "rationale": decision.rationale,
        "result": decision.result,
        "result_fp": decision.result_fp,
        "requested_at": decision.requested_at.isoformat(),
        "decided_at": decision.decided_at.isoformat() if decision.decided_at else None,
        "evidence": evidence,
    }


def _observed(fact: Any) -> dict[str, Any]:
    fact = fact if isinstance(fact, Mapping) else {}
    return {name: fact.get(name) for name in ("operation", "state", "result_fp") if name in fact}


def trail_verify(document: Any) -> Verification:
    """Verify a trail document without the database (needs the chain keys in the settings).

    Raises :class:`TrailUnreadable` when the document is not a trail; a trail that was
    edited verifies as broken, naming the first checkpoint or row that does not agree.
    """
    if not isinstance(document, Mapping) or document.get("format") != TRAIL_FORMAT:
        raise TrailUnreadable(
            f"This is not an audit trail export (its 'format' is not {TRAIL_FORMAT!r}). "
            "Export the trail from the instance's page (Download the audit trail)."
        )
    try:
        subject = Subject.parse(str(document.get("subject", "")))
        checkpoints = [_checkpoint_row(cp) for cp in _list(document, "checkpoints")]
        operations = [_operation_row(op) for op in _list(document, "operations")]
        results = [
            (d["id"], d.get("result"), d.get("result_fp", "")) for d in _list(document, "decisions")
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise TrailUnreadable(f"The trail is incomplete or malformed: {exc!r}.") from None
    return verify_rows(subject, checkpoints, operations, results=results)


def _list(document: Mapping[str, Any], name: str) -> Sequence[Any]:
    value = document.get(name)
    if not isinstance(value, list):
        raise TrailUnreadable(f"The trail has no list of {name!r}.")
    return value


def _checkpoint_row(cp: Mapping[str, Any]) -> tuple[Any, ...]:
    fact = cp["fact"]
    if isinstance(fact, str):
        text = fact
    else:
        try:
            text = canonical_bytes(fact).decode()
        except (CanonicalError, TypeError):
            text = "not canonical"
    return (
        int(cp["seq"]),
        str(cp["kind"]),
        text,
        str(cp["fact_fp"]),
        str(cp["prev_link"]),
        str(cp["link"]),
        str(cp["key_id"]),
        str(cp.get("projection_fp", "")),
    )


def _operation_row(op: Mapping[str, Any]) -> tuple[Any, ...]:
    return (op["key"], *(op[column] for column, _ in COMPARED))
