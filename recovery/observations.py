"""What a provider said about an operation outside its own settlement (models only).

The services are :mod:`recovery.services.observations`; the rows are chained as
``operation.observation`` facts.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _


class ObservationKind(models.TextChoices):
    """Why a provider's word about an operation was kept. Persisted: never rename one."""

    RECONCILE = "reconcile", "Reconcile (the provider asked after the fact)"
    CHECK = "check", "Automatic verification check"
    LATE = "late", "Late answer (arrived after the step was decided or its fence lapsed)"


class Observation(models.Model):
    """What a provider said about an operation outside its own settlement: evidence.

    A reconcile's answer, an automatic check's finding, or an answer that arrived late
    (after the step turned ``outcome_unknown``, or under a stale fence). It is chained
    (``operation.observation``) and never moves the operation by itself: the host applies
    a reconcile only under the action's declared policy, through the ledger's own moves.
    ``values`` are output values the provider returned (an operator must see them) or a
    check's finding; never the input, never a credential.
    """

    operation = models.ForeignKey(
        "recovery.Operation", on_delete=models.PROTECT, related_name="observations"
    )
    kind = models.CharField(max_length=10, choices=ObservationKind.choices)
    source = models.CharField(max_length=100, help_text="reconcile, a check id, or the phase.")
    outcome = models.CharField(max_length=12)
    values = models.JSONField(default=dict, blank=True)
    reason = models.TextField(blank=True, default="")
    values_fp = models.CharField(max_length=64)
    input_fp = models.CharField(max_length=64, blank=True, default="")
    asked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The operator who asked the provider now; empty when the engine asked.",
    )
    applied = models.BooleanField(
        default=False, help_text="The host settled the step with it (the provider's authority)."
    )
    chain_seq = models.BigIntegerField()
    observed_at = models.DateTimeField()

    class Meta:
        verbose_name = _("observation")
        verbose_name_plural = _("observations")
        db_table = "recovery_observation"
        indexes = [models.Index(fields=["operation", "kind"], name="recovery_obs_operation")]

    def __str__(self) -> str:
        return f"{self.kind} {self.source}: {self.outcome} on {self.operation_id}"
