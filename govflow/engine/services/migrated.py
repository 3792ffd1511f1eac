"""What an instance's chain says it was migrated to: read by the pinning check.

The contract-migration services (``contract_migrations``) append a ``MIGRATED`` fact when
an approved migration changes what an instance is pinned to; the run's pinning check
(``definitions.pinned_contracts_refusal``) compares the instance's stored contracts with
those facts. This module is the part both need, below both: it reads the chain only.
"""

from __future__ import annotations

from recovery.api import Subject, canonical_bytes, chain_verify, facts_read, incident_open

from ..projection import SUBJECT_TYPE

__all__ = ["MIGRATED", "approved_contracts"]

MIGRATED = "engine.contract_migrated"
"""The kind of the chain fact an approved migration appends (persisted: never renamed)."""


def approved_contracts(instance_id: int, migrated: str) -> str:
    """'' when ``migrated`` is exactly what the approved migrations on the chain say.

    Otherwise why not: the chain does not verify (an integrity incident is opened with
    its position: its own commit), or the instance's own contracts differ from the
    approved ones.
    """
    subject = Subject(SUBJECT_TYPE, str(instance_id))
    verification = chain_verify(subject)
    if not verification.ok:
        incident_open(verification=verification)
        return (
            f"Instance {instance_id} runs under migrated action contracts, but its chain "
            f"does not verify ({verification.reason}), so the migrations cannot be trusted. "
            "Nothing runs on it until the incident is investigated."
        )
    approved: dict[str, dict] = {}
    for fact in facts_read(subject=subject, kind=MIGRATED):
        approved[fact["action"]] = fact["contract"]
    if canonical_bytes(approved).decode() == migrated:
        return ""
    return (
        f"Instance {instance_id}'s migrated action contracts do not match the migrations "
        "approved on its chain: they were changed in the database. Nothing runs on it. "
        "Restore the instance row from a backup and re-verify the integrity incident, or "
        "cancel the instance."
    )
