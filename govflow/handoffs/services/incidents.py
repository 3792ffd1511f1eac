"""Engine incidents resolved with a recorded investigation, and what stays open.

An engine incident (a failed step, a blocked route, a refused dispatch) is something an
operator must look at. Resolving one records who looked, what they found and the evidence
they attached, on the incident's row and as a fact on the instance's chain, in one commit.
It moves nothing by itself: the instance goes on only through its own actions (retry,
decision, cancel).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import transaction

from govflow.engine.db import clock
from govflow.engine.emit import incident_resolved
from govflow.engine.errors import EngineConflict, InvalidRequest, NotPermitted
from govflow.engine.limits import admit_text
from govflow.engine.models import Incident, Instance, Token, TokenState
from govflow.engine.selectors import instance_subject
from recovery.api import (
    FingerprintKind,
    IncidentStatus,
    evidence_attach,
    evidence_received,
    fact_append,
    fingerprint_value,
    incidents_of,
)

__all__ = ["RESOLVE", "OpenCases", "engine_incident_resolve", "open_cases_in", "open_cases_of"]

RESOLVE = "engine.operate_instance"
RESOLVED_FACT = "engine.incident_resolved"


def engine_incident_resolve(
    *, incident_id: int, actor, rationale: str, evidence: Sequence = ()
) -> Incident:
    """Resolve an open engine incident, recording the investigation.

    ``rationale`` says what was looked at and what it showed (required); ``evidence`` is
    optional files (the accepted evidence types). The incident row keeps the actor, the
    rationale and the evidence; the fact ``engine.incident_resolved`` on the instance's
    chain keeps their fingerprints. An incident already resolved is refused and nothing
    changes.
    """
    if actor is None or not actor.has_perm(RESOLVE):
        raise NotPermitted(
            f"{actor} may not resolve engine incidents: the permission {RESOLVE!r} is required."
        )
    rationale = rationale.strip() if isinstance(rationale, str) else rationale
    if not rationale:
        raise InvalidRequest(
            "Say what you investigated and what it showed: an incident is resolved with a "
            "recorded investigation."
        )
    admit_text(rationale, name="rationale", max_length=4000)
    incident = Incident.objects.filter(pk=incident_id).first()
    if incident is None:
        raise InvalidRequest(f"No engine incident has id {incident_id}.")
    subject = instance_subject(incident.instance_id)
    with evidence_received(evidence) as batch, transaction.atomic():
        files = evidence_attach(batch=batch, subject=subject)
        changed = Incident.objects.filter(pk=incident_id, resolved_at__isnull=True).update(
            resolved_at=clock(),
            resolved_by=actor,
            resolution=rationale,
            resolution_evidence=[f.pk for f in files],
        )
        if changed != 1:
            raise _already_resolved(incident_id)
        fact_append(
            subject=subject,
            kind=RESOLVED_FACT,
            fact={
                "incident": incident.pk,
                "kind": incident.kind,
                "resolved_by": actor.pk,
                "rationale_fp": fingerprint_value(FingerprintKind.INPUT, rationale),
                "evidence": sorted(f.fingerprint for f in files),
            },
        )
        incident_resolved(incident.instance, incident=incident.pk, kind=incident.kind)
    incident.refresh_from_db()
    return incident


def _already_resolved(incident_id: int) -> EngineConflict:
    incident = Incident.objects.select_related("resolved_by").get(pk=incident_id)
    by = f" by {incident.resolved_by}" if incident.resolved_by_id else ""
    return EngineConflict(
        f"Engine incident {incident_id} is already resolved{by} at "
        f"{incident.resolved_at:%Y-%m-%d %H:%M} UTC. Nothing was changed."
    )


@dataclass
class OpenCases:
    """What still needs someone on an instance, whatever its status."""

    uncertain: list[Token] = field(default_factory=list)
    engine_incidents: list[Incident] = field(default_factory=list)
    integrity_incidents: list = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.uncertain or self.engine_incidents or self.integrity_incidents)

    def summary(self) -> str:
        """One sentence per kind of open case, for a message after cancelling."""
        parts = []
        if self.uncertain:
            steps = ", ".join(f"'{t.node_id}'" for t in self.uncertain)
            parts.append(
                f"The outcome of step {steps} stays unknown: cancelling undoes nothing outside, "
                "so its case stays open until someone records what happened (effect "
                "confirmed or effect absent, with evidence)."
            )
        if self.engine_incidents:
            ids = ", ".join(f"#{i.pk}" for i in self.engine_incidents)
            parts.append(f"Engine incident {ids} stays open until it is resolved.")
        if self.integrity_incidents:
            ids = ", ".join(f"#{i.pk}" for i in self.integrity_incidents)
            parts.append(f"Integrity incident {ids} stays open until it is resolved.")
        return " ".join(parts)


def open_cases_of(instance: Instance) -> OpenCases:
    """The steps of unknown outcome and the open incidents of ``instance`` (reads only)."""
    return open_cases_in(
        Token.objects.filter(instance=instance, state=TokenState.OUTCOME_UNKNOWN),
        Incident.objects.filter(instance=instance, resolved_at__isnull=True),
        incidents_of(instance_subject(instance.pk), open_only=True),
    )


def open_cases_in(tokens, engine_incidents, integrity_incidents) -> OpenCases:
    """The open cases among records already read (the instance page reads them all)."""
    return OpenCases(
        uncertain=sorted(
            (t for t in tokens if t.state == TokenState.OUTCOME_UNKNOWN), key=lambda t: t.ordinal
        ),
        engine_incidents=sorted(
            (i for i in engine_incidents if i.resolved_at is None), key=lambda i: i.pk
        ),
        integrity_incidents=[i for i in integrity_incidents if i.status == IncidentStatus.OPEN],
    )
