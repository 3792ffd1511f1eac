"""Recovery models: data, constraints and indexes only. Writes go through services.

No model has a column for raw input, output, error text or credentials: the ledger holds
fingerprints only (invariant I1).
"""

from __future__ import annotations

from django.conf import settings
from django.core.files.storage import storages
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _

from .states import (
    TERMINAL,
    DecisionKind,
    DecisionState,
    IncidentStatus,
    OperationState,
    RecoveryMode,
    ResolutionState,
)

FP = {"max_length": 64}


class Lease(models.Model):
    """Who may advance a resource now. The row is never deleted: its fence only grows."""

    key = models.CharField(max_length=200, primary_key=True)
    # NULL, not "", means released: the acquire upsert tests "holder IS NULL".
    holder = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    fence = models.BigIntegerField()
    acquired_at = models.DateTimeField(null=True)
    expires_at = models.DateTimeField(null=True)
    released_at = models.DateTimeField(null=True)

    class Meta:
        verbose_name = _("lease")
        verbose_name_plural = _("leases")
        db_table = "recovery_lease"
        constraints = [
            models.CheckConstraint(condition=Q(fence__gte=1), name="lease_fence_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.key} (fence {self.fence})"


class Operation(models.Model):
    """The durable record of one invocation boundary, with fingerprints only."""

    key = models.CharField(max_length=80)  # unique: the constraint in Meta (ADR 0046)
    subject_type = models.CharField(max_length=100)
    subject_id = models.CharField(max_length=100)
    step_id = models.CharField(max_length=200)
    action = models.CharField(max_length=200)
    recovery_mode = models.CharField(max_length=20, choices=RecoveryMode.choices)
    definition_fp = models.CharField(**FP)
    input_fp = models.CharField(**FP)
    preview_fp = models.CharField(**FP)
    access_fp = models.CharField(**FP)
    idempotency_fp = models.CharField(**FP)
    result_fp = models.CharField(max_length=64, blank=True, default="")
    lease_key = models.CharField(max_length=200)
    fence = models.BigIntegerField()
    # Written at every step: bounded by validation, not a CHECK constraint (ADR 0061).
    ordinal = models.IntegerField(validators=[MinValueValidator(0)])
    state = models.CharField(max_length=20, choices=OperationState.choices)
    revision = models.IntegerField(validators=[MinValueValidator(0)])
    chain_seq = models.BigIntegerField()
    recorded_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        verbose_name = _("operation")
        verbose_name_plural = _("operations")
        db_table = "recovery_operation"
        # Every new row version of an operation writes an entry into each index whose
        # predicate it meets (a state change is never a HOT update): ADR 0046.
        constraints = [
            # A constraint, not unique=True: on PostgreSQL that also built a
            # varchar_pattern_ops index for prefix LIKE, which nothing asks of a key.
            models.UniqueConstraint(fields=["key"], name="recovery_operation_key"),
        ]
        indexes = [
            # With chain_seq: a success finds the operations past its run's verified mark
            # by a range (ADR 0034); the subject alone is its prefix.
            models.Index(
                fields=["subject_type", "subject_id", "chain_seq"], name="recovery_op_subject_seq"
            ),
            models.Index(fields=["idempotency_fp"], name="recovery_op_idempotency"),
            # Only the states an operation leaves again (prepared, dispatched, outcome
            # unknown): no query looks a settled one up by its state across subjects.
            models.Index(
                fields=["state"],
                name="recovery_op_unsettled",
                condition=Q(state__in=sorted(set(OperationState.values) - TERMINAL)),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.key[:15]}… ({self.state})"


class Checkpoint(models.Model):
    """One link of a subject's keyed BLAKE3 hash chain."""

    subject_type = models.CharField(max_length=100)
    subject_id = models.CharField(max_length=100)
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=40)
    fact = models.TextField(help_text="Canonical JSON of the fact (fingerprints, states).")
    fact_fp = models.CharField(**FP)
    prev_link = models.CharField(**FP)
    link = models.CharField(**FP)
    key_id = models.CharField(max_length=32)
    projection_fp = models.CharField(
        max_length=64,
        blank=True,
        default="",
        help_text="The owner's projection fingerprint as this checkpoint left it (in the fact).",
    )
    recorded_at = models.DateTimeField()

    class Meta:
        verbose_name = _("checkpoint")
        verbose_name_plural = _("checkpoints")
        db_table = "recovery_checkpoint"
        constraints = [
            models.UniqueConstraint(
                fields=["subject_type", "subject_id", "seq"], name="recovery_checkpoint_seq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.subject_type}:{self.subject_id} #{self.seq} {self.kind}"


class IntegrityIncident(models.Model):
    """A broken chain or contradictory fact. While open, success is refused for the subject.

    It is resolved only by an :class:`IncidentResolution` that one person requests and a
    second person approves, and only if the subject's chain verifies at that approval.
    """

    subject_type = models.CharField(max_length=100)
    subject_id = models.CharField(max_length=100)
    position = models.BigIntegerField(null=True, blank=True)
    reason = models.TextField()
    status = models.CharField(
        max_length=10, choices=IncidentStatus.choices, default=IncidentStatus.OPEN
    )
    detected_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The approver of the resolution (never its requester).",
    )

    class Meta:
        verbose_name = _("integrity incident")
        verbose_name_plural = _("integrity incidents")
        db_table = "recovery_incident"
        permissions = [
            (
                "resolve_incident",
                "Can request, approve or reject the resolution of an integrity incident",
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["subject_type", "subject_id"],
                condition=Q(status="open"),
                name="recovery_one_open_incident_per_subject",
            ),
        ]

    def __str__(self) -> str:
        return f"Incident on {self.subject_type}:{self.subject_id} ({self.status})"


class IncidentResolution(models.Model):
    """A request to resolve an integrity incident: what was repaired and how.

    One person requests it; a different person approves it, and approval resolves the
    incident only if the subject's chain verifies at that moment.
    """

    incident = models.ForeignKey(
        IntegrityIncident, on_delete=models.PROTECT, related_name="resolutions"
    )
    rationale = models.TextField(help_text="What was repaired, and how.")
    watermark = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="The subject's revision the requester saw before (verification demands "
        "at least this many checkpoints).",
    )
    state = models.CharField(
        max_length=10, choices=ResolutionState.choices, default=ResolutionState.REQUESTED
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    requested_at = models.DateTimeField()
    evidence = models.JSONField(
        default=list,
        blank=True,
        help_text="Ids of the evidence files the requester attached (their fingerprints "
        "are in the request's fact on the incident's trail).",
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The approver (or rejecter); never the requester.",
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_note = models.TextField(blank=True, default="")

    class Meta:
        verbose_name = _("incident resolution")
        verbose_name_plural = _("incident resolutions")
        db_table = "recovery_incident_resolution"
        constraints = [
            models.CheckConstraint(
                condition=Q(decided_by__isnull=True) | ~Q(decided_by=F("requested_by")),
                name="recovery_incident_resolution_four_eyes",
            ),
            models.UniqueConstraint(
                fields=["incident"],
                condition=Q(state="requested"),
                name="recovery_one_open_resolution_per_incident",
            ),
        ]

    def __str__(self) -> str:
        return f"Resolution {self.pk} of incident {self.incident_id} ({self.state})"


class Decision(models.Model):
    """An operator's resolution of an uncertain operation, approved by a second person."""

    operation = models.ForeignKey(Operation, on_delete=models.PROTECT, related_name="decisions")
    kind = models.CharField(max_length=20, choices=DecisionKind.choices)
    rationale = models.TextField()
    checks = models.JSONField(default=dict, blank=True)
    result = models.JSONField(
        null=True,
        blank=True,
        help_text="What the confirmed effect returned, as the requester recorded it (effect "
        "confirmed only); applied as the step's output when approved.",
    )
    result_fp = models.CharField(
        max_length=64,
        blank=True,
        default="",
        help_text="BLAKE3 of the result's canonical bytes; chained with the request.",
    )
    state = models.CharField(
        max_length=10, choices=DecisionState.choices, default=DecisionState.REQUESTED
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The approver (or rejecter); never the requester.",
    )
    decision_note = models.TextField(blank=True, default="")
    requested_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("decision")
        verbose_name_plural = _("decisions")
        db_table = "recovery_decision"
        permissions = [
            ("request_decision", "Can request a decision on an uncertain operation"),
            ("approve_decision", "Can approve or reject another person's decision"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(decided_by__isnull=True) | ~Q(decided_by=F("requested_by")),
                name="recovery_decision_four_eyes",
            ),
            models.UniqueConstraint(
                fields=["operation"],
                condition=Q(state="requested"),
                name="recovery_one_open_request_per_operation",
            ),
            models.UniqueConstraint(
                fields=["operation"],
                condition=Q(state="approved") & ~Q(kind__in=["cancel", "compensate"]),
                name="recovery_one_approved_effect_decision",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} on {self.operation_id} ({self.state})"


def evidence_storage():
    return storages[getattr(settings, "RECOVERY_EVIDENCE_STORAGE", "default")]


class EvidenceFile(models.Model):
    """A file an operator uploaded as evidence, stored by its BLAKE3 fingerprint."""

    decision = models.ForeignKey(
        Decision, null=True, blank=True, on_delete=models.PROTECT, related_name="evidence"
    )
    attached_to = models.CharField(
        max_length=201,
        blank=True,
        default="",
        help_text="For evidence of something other than a decision (an investigation): "
        "the subject it concerns, as type:id.",
    )
    file = models.FileField(storage=evidence_storage, max_length=200)
    fingerprint = models.CharField(**FP)
    size = models.PositiveBigIntegerField()
    content_type = models.CharField(max_length=100)
    name = models.CharField(max_length=120, help_text="Sanitised original file name.")
    uploaded_at = models.DateTimeField()

    class Meta:
        verbose_name = _("evidence file")
        verbose_name_plural = _("evidence files")
        db_table = "recovery_evidence"

    def __str__(self) -> str:
        return f"{self.name} ({self.fingerprint[:12]}…)"


class AnchorMark(models.Model):
    """The newest record this database knows was appended to an anchor store.

    Anchors witness the database; this row witnesses the anchors. A store that lost
    records from its end (or was replaced) is shorter than its mark, so undoing both takes
    write access to the database *and* to the store.
    """

    store = models.CharField(max_length=500, unique=True, help_text="Where the records are.")
    record = models.BigIntegerField(help_text="The number of the newest record appended.")
    link = models.CharField(**FP)
    written_at = models.DateTimeField()

    class Meta:
        verbose_name = _("anchor mark")
        verbose_name_plural = _("anchor marks")
        db_table = "recovery_anchor_mark"

    def __str__(self) -> str:
        return f"{self.store} #{self.record}"


# The observation and the compensation intent live in modules of their own (this one is
# full); imported here so Django finds them with the app's models.
from .audits import ChainAudit  # noqa: E402
from .compensations import Compensation  # noqa: E402
from .observations import Observation, ObservationKind  # noqa: E402
from .stored_marks import StoredMark  # noqa: E402

__all__ = [
    "AnchorMark",
    "ChainAudit",
    "Checkpoint",
    "Compensation",
    "Decision",
    "EvidenceFile",
    "IncidentResolution",
    "IntegrityIncident",
    "Lease",
    "Observation",
    "ObservationKind",
    "Operation",
    "StoredMark",
    "evidence_storage",
]
