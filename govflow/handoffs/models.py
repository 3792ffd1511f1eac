"""Decision batches: several ordinary decision requests, grouped, fingerprinted and approved
together (bulk triage, ADR 0024).

A batch adds no new way to move a step. Each of its items is a plain ``recovery`` decision,
requested and chained as a single one is; the batch row only says which decisions belong
together, the fingerprint of the preview the requester submitted, and who approved or
rejected them as a whole.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _


class BatchState(models.TextChoices):
    """Where a batch stands. Persisted: never rename one."""

    REQUESTED = "requested", _("Awaiting approval")
    APPROVED = "approved", _("Approved")
    REJECTED = "rejected", _("Rejected")


class DecisionBatch(models.Model):
    """Decisions of one kind on uncertain steps of one action, definition and tenant."""

    kind = models.CharField(_("decision"), max_length=20)
    action = models.CharField(_("action"), max_length=200)
    definition = models.ForeignKey(
        "engine.Definition", on_delete=models.PROTECT, related_name="+", verbose_name=_("workflow")
    )
    tenant = models.CharField(_("tenant"), max_length=100)
    fingerprint = models.CharField(
        _("fingerprint"),
        max_length=64,
        help_text=_(
            "BLAKE3 of the previewed operations (keys and ledger revisions), the decision "
            "and what it records."
        ),
    )
    rationale = models.TextField(_("rationale"))
    state = models.CharField(
        _("state"), max_length=10, choices=BatchState.choices, default=BatchState.REQUESTED
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    requested_at = models.DateTimeField(_("requested at"))
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(_("decided at"), null=True, blank=True)
    decision_note = models.TextField(_("note"), blank=True, default="")

    class Meta:
        db_table = "handoffs_decision_batch"
        verbose_name = _("decision batch")
        verbose_name_plural = _("decision batches")
        constraints = [
            models.CheckConstraint(
                condition=Q(decided_by__isnull=True) | ~Q(decided_by=F("requested_by")),
                name="handoffs_batch_four_eyes",
            ),
        ]
        indexes = [models.Index(fields=["state", "requested_at"], name="handoffs_batch_open")]

    def __str__(self) -> str:
        return _("Batch %(id)s: %(kind)s on %(action)s") % {
            "id": self.pk,
            "kind": self.kind,
            "action": self.action,
        }


class BatchItem(models.Model):
    """One decision of a batch, with the ledger revision its operation had in the preview."""

    batch = models.ForeignKey(DecisionBatch, on_delete=models.PROTECT, related_name="items")
    decision = models.OneToOneField("recovery.Decision", on_delete=models.PROTECT, related_name="+")
    token = models.ForeignKey("engine.Token", on_delete=models.PROTECT, related_name="+")
    operation_key = models.CharField(max_length=80)
    revision = models.PositiveIntegerField()
    reference = models.CharField(
        _("evidence reference"),
        max_length=500,
        help_text=_("Where the evidence shows this operation (a record number, a line)."),
    )

    class Meta:
        db_table = "handoffs_batch_item"
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"{self.batch_id}: {self.operation_key}"
