"""Asking for an integrity incident's resolution: what was repaired, how, and on what evidence.

The first of the four-eyes steps (:mod:`recovery.services.resolutions` holds the others).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from ..models import IncidentResolution, IntegrityIncident
from .evidence import evidence_attach, evidence_received
from .facts import incident_trail
from .resolutions import (
    IncidentConflict,
    IncidentError,
    _fp,
    _locked_open_incident,
    _recheck,
    _record,
    _require_open,
    _require_perm,
    _text,
)

__all__ = ["incident_resolve_request"]


def _admit_request(rationale: Any, watermark: Any) -> str:
    """The rationale of a resolution request, stripped; refused with what to write."""
    rationale = _text(
        rationale,
        "rationale",
        "A resolution request needs a rationale: say what was repaired and how (for "
        "example which rows were restored from which backup).",
    )
    if watermark is not None and (
        not isinstance(watermark, int) or isinstance(watermark, bool) or watermark < 0
    ):
        raise IncidentError("The watermark is a revision: a whole number, 0 or more.")
    return rationale


def incident_resolve_request(
    *,
    incident_id: int,
    requested_by,
    rationale: str,
    watermark: int | None = None,
    evidence: Sequence = (),
) -> IncidentResolution:
    """Ask for an open incident to be resolved, saying what was repaired and how.

    The subject's chain must verify now (with ``watermark``, the revision last seen, when
    given; an empty chain needs one). ``evidence`` is optional files the repair rests on;
    their fingerprints go into the request's fact. Nothing is resolved until a second
    person approves.
    """
    _require_perm(requested_by, "request the resolution of an integrity incident")
    rationale = _admit_request(rationale, watermark)
    incident = _require_open(
        IntegrityIncident.objects.select_related("resolved_by").filter(pk=incident_id).first(),
        incident_id,
    )
    # A read: a refused request leaves the incident as it was (a wrong watermark must not
    # replace the reason it was opened for).
    verification, problem = _recheck(incident, watermark, refresh=False)
    if problem:
        raise IncidentError(
            f"Incident {incident_id} cannot be resolved yet: {problem}. Repair the cause "
            "first (for example restore the changed rows from a backup); nothing was "
            "requested."
        )
    try:
        with evidence_received(evidence) as batch, transaction.atomic():
            resolution = _record_request(
                _locked_open_incident(incident_id),
                batch,
                requested_by=requested_by,
                rationale=rationale,
                watermark=watermark,
                revision=verification.length,
            )
    except IntegrityError as exc:
        raise IncidentConflict(
            f"A resolution of incident {incident_id} already awaits approval. Approve, "
            "reject or withdraw that one first."
        ) from exc
    resolution.refresh_from_db()
    return resolution


def _record_request(incident, batch, *, requested_by, rationale, watermark, revision):
    """The request's row, its evidence and its fact (inside the caller's transaction)."""
    resolution = IncidentResolution.objects.create(
        incident=incident,
        rationale=rationale,
        watermark=watermark,
        requested_by=requested_by,
        requested_at=Now(),
    )
    files = evidence_attach(batch=batch, subject=incident_trail(incident.pk))
    if files:
        resolution.evidence = [f.pk for f in files]
        resolution.save(update_fields=["evidence"])
    _record(
        resolution,
        "incident.resolution_requested",
        {
            "subject_type": incident.subject_type,
            "subject_id": incident.subject_id,
            "position": incident.position,
            "reason_fp": _fp(incident.reason),
            "requested_by": requested_by.pk,
            "rationale_fp": _fp(rationale),
            "watermark": watermark,
            "revision": revision,
            "evidence": [f.fingerprint for f in files],
        },
    )
    return resolution
