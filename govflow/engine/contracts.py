"""Action contracts: what a definition pins of each action it uses (no database here).

A provider's release can change an action under a running instance. Whatever changes the
*safety meaning* of a step is pinned when the definition is published, and compared with
the registry before an instance runs:

- the recovery mode (``atomic``, ``non_atomic``, ``snapshot_restore``, ``irreversible``),
  and with it the gate the node must pin (``backup_ref``, ``approval_ref``);
- the verification checks an operator answers about an uncertain effect (ids and
  instructions, in order);
- the input schema (its canonical bytes);
- the output schema, when the action declares one (its canonical bytes): it types what an
  operator confirming an uncertain effect must supply. An action without one has the
  contract it had before output schemas existed, so definitions pinned then still match.

Not pinned: the title, the preview and execute code, poll and reconcile hooks and the
retry policy. They are the provider's to change in a release; the idempotency key keeps a
repeated effect single (docs/adr/0008-definitions-pinned-with-their-actions.md).

A contract is stored as canonical JSON beside the definition's document, and the
definition's fingerprint covers both (:func:`pinned_fingerprint`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from recovery.api import FingerprintKind, canonical_bytes, fingerprint, fingerprint_value

from .registry import ActionDefinition

__all__ = [
    "action_contract",
    "contract_changes",
    "contracts_of",
    "pinned_fingerprint",
    "stored_fingerprint",
]

# Contract parts are hashed in the definition domain, each tagged: a tagged list never has
# the bytes of a definition document (an object), so the fingerprints cannot collide.
_CHECKS = "action-contract-checks"
_SCHEMA = "action-contract-schema"
_OUTPUT = "action-contract-output"
_CONTRACT = "action-contract"


def action_contract(action: ActionDefinition) -> dict[str, Any]:
    """The pinned contract of ``action``: mode, check ids and the fingerprints."""
    checks = [[check.id, check.instruction] for check in action.checks]
    contract = {
        "mode": str(action.recovery_mode),
        "checks": [check.id for check in action.checks],
        "checks_fp": fingerprint_value(FingerprintKind.DEFINITION, [_CHECKS, checks]),
        "schema_fp": fingerprint_value(
            FingerprintKind.DEFINITION, [_SCHEMA, dict(action.input_schema)]
        ),
    }
    parts = [_CONTRACT, contract["mode"], contract["checks_fp"], contract["schema_fp"]]
    if action.output_schema is not None:
        contract["output_fp"] = fingerprint_value(
            FingerprintKind.DEFINITION, [_OUTPUT, dict(action.output_schema)]
        )
        parts.append(contract["output_fp"])
    contract["contract_fp"] = fingerprint_value(FingerprintKind.DEFINITION, parts)
    return contract


def contracts_of(names: Iterable[str], lookup) -> dict[str, dict[str, Any]]:
    """The contracts of the actions ``names``, as ``lookup(name)`` returns them now."""
    return {name: action_contract(lookup(name)) for name in sorted(names)}


def pinned_fingerprint(document: Mapping[str, Any], contracts: Mapping[str, Any]) -> str:
    """The fingerprint of a definition published with ``contracts`` pinned.

    The canonical bytes of ``{"contracts": …, "document": …}``: equal, byte for byte, to
    what :func:`stored_fingerprint` hashes from the two stored texts.
    """
    return fingerprint(
        FingerprintKind.DEFINITION,
        canonical_bytes({"contracts": dict(contracts), "document": dict(document)}),
    )


def stored_fingerprint(document: str, contracts: str) -> str:
    """Hash a definition's stored texts exactly as they are stored.

    No parsing: the bytes are hashed as they are, so any change, even of whitespace or key
    order, changes the hash. Canonical texts give :func:`pinned_fingerprint`; a definition
    published before contracts were pinned (``contracts`` empty) hashes its document
    alone, as it was published.
    """
    if not contracts:
        return fingerprint(FingerprintKind.DEFINITION, document.encode("utf-8", "surrogatepass"))
    data = f'{{"contracts":{contracts},"document":{document}}}'
    return fingerprint(FingerprintKind.DEFINITION, data.encode("utf-8", "surrogatepass"))


def contract_changes(name: str, pinned: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    """What changed in action ``name`` since ``pinned``, for an operator; '' if nothing."""
    if pinned.get("contract_fp") == current.get("contract_fp"):
        return ""
    changes = []
    if pinned.get("mode") != current.get("mode"):
        changes.append(f"recovery mode was {pinned.get('mode')}, is now {current.get('mode')}")
    if pinned.get("checks_fp") != current.get("checks_fp"):
        before, after = list(pinned.get("checks") or []), list(current.get("checks") or [])
        detail = []
        added = [c for c in after if c not in before]
        removed = [c for c in before if c not in after]
        if added:
            detail.append(f"added {', '.join(added)}")
        if removed:
            detail.append(f"removed {', '.join(removed)}")
        if not detail:
            detail.append(
                "reordered"
                if sorted(before) == sorted(after) and before != after
                else "instructions changed"
            )
        changes.append(f"verification checks changed ({'; '.join(detail)})")
    if pinned.get("schema_fp") != current.get("schema_fp"):
        changes.append("input schema changed")
    before, after = pinned.get("output_fp"), current.get("output_fp")
    if before != after:
        changes.append(
            "output schema added"
            if before is None
            else "output schema removed"
            if after is None
            else "output schema changed"
        )
    if not changes:
        changes.append("contract changed")
    return f"{name}: {', '.join(changes)}"
