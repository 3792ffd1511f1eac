"""The compensation intent: the durable record that one succeeded operation is to be undone.

Data and constraints only (its services are :mod:`recovery.services.compensations`). An
intent names its original operation and its own ``cmp-`` operation, which carries the
compensation through the ledger like any other effect (``prepared`` → ``dispatched`` →
``succeeded`` | ``failed`` | ``outcome_unknown``); the intent's state *is* that operation's
state. Like every row of the core it holds fingerprints, ids and states: no raw input,
output or error text (invariant I1).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from .states import CompensationApproval, CompensationTrigger


class Compensation(models.Model):
    """The intent to undo one succeeded operation; at most one per operation."""

    original = models.ForeignKey("recovery.Operation", on_delete=models.PROTECT, related_name="+")
    operation = models.OneToOneField(
        "recovery.Operation",
        on_delete=models.PROTECT,
        related_name="compensation_intent",
        help_text="The compensation's own ledger operation (key cmp-…).",
    )
    subject_type = models.CharField(max_length=100)
    subject_id = models.CharField(max_length=100)
    position = models.PositiveIntegerField(
        help_text="The original's place in its subject; compensations run highest first."
    )
    tenant = models.CharField(max_length=100)
    trigger = models.CharField(max_length=10, choices=CompensationTrigger.choices)
    approval = models.CharField(max_length=10, choices=CompensationApproval.choices)
    decision = models.ForeignKey(
        "recovery.Decision",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The approved decision the dispatch is bound to, while it still applies.",
    )
    bound_revision = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="The subject's revision right after the approval."
    )
    bound_preview_fp = models.CharField(max_length=64, blank=True, default="")
    bound_input_fp = models.CharField(max_length=64, blank=True, default="")
    bound_tenant = models.CharField(max_length=100, blank=True, default="")
    recorded_at = models.DateTimeField()
    not_before = models.DateTimeField(
        null=True,
        blank=True,
        help_text="While its provider answers pending: when it is next polled (database time).",
    )

    class Meta:
        db_table = "recovery_compensation"
        constraints = [
            models.UniqueConstraint(
                fields=["original"], name="recovery_one_compensation_per_operation"
            ),
            models.CheckConstraint(
                condition=Q(decision__isnull=True) | Q(bound_revision__isnull=False),
                name="recovery_compensation_approval_bound",
            ),
        ]
        indexes = [
            models.Index(fields=["subject_type", "subject_id"], name="recovery_cmp_subject"),
        ]

    def __str__(self) -> str:
        return f"Compensation of {self.original_id} by {self.operation_id}"
