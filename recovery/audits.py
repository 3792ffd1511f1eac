"""How far the periodic chain audit has come (model only; ADR 0038).

The services are :mod:`recovery.services.audit`.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class ChainAudit(models.Model):
    """The periodic chain audit's progress, kept so that a restart does not start over.

    Every checkpoint up to ``checkpoint`` (by id) belongs to a subject whose whole chain
    was verified, with the anchors, after that checkpoint was written. A subject whose
    chain grows appears again past it; one that does not grow is not read again.
    """

    name = models.CharField(max_length=100, unique=True)
    checkpoint = models.BigIntegerField(
        default=0, help_text="The id of the newest checkpoint the audit has covered."
    )
    subjects = models.BigIntegerField(default=0, help_text="Chains verified by the audit so far.")
    broken = models.BigIntegerField(default=0, help_text="Broken chains the audit found so far.")
    updated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("chain audit")
        verbose_name_plural = _("chain audits")
        db_table = "recovery_chain_audit"

    def __str__(self) -> str:
        return f"{self.name} through checkpoint {self.checkpoint}"
