"""A run's verified mark kept for the next run (model only; ADR 0066).

The services are :mod:`recovery.chain.stored` (sealing) and
:mod:`recovery.services.stored_marks` (reading and writing).
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class StoredMark(models.Model):
    """Through which checkpoint a run verified a subject's chain, sealed with the chain key.

    A later run of the subject verifies only the checkpoints from ``seq`` on and the
    operations that can still move, instead of the whole chain. The row vouches for
    nothing by itself: ``mac`` is a keyed BLAKE3 of the rest under a key derived from the
    chain key ``key_id``, which never reaches the database, so a row written by anyone but
    GovFlow is ignored.
    """

    subject_type = models.CharField(max_length=100)
    subject_id = models.CharField(max_length=100)
    seq = models.BigIntegerField(help_text="The checkpoint verified through.")
    link = models.CharField(max_length=64, help_text="That checkpoint's link.")
    ops = models.TextField(help_text="The operations that can still move, as replayed there.")
    key_id = models.CharField(max_length=32)
    mac = models.CharField(max_length=64)
    written_at = models.DateTimeField()

    class Meta:
        verbose_name = _("stored chain mark")
        verbose_name_plural = _("stored chain marks")
        db_table = "recovery_chain_mark"
        constraints = [
            models.UniqueConstraint(
                fields=["subject_type", "subject_id"], name="chain_mark_one_per_subject"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.subject_type}:{self.subject_id} through #{self.seq}"
