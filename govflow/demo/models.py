"""The demo module's own table, in the engine's database.

``demo.record_decision_note`` is an *atomic* action: its row commits in the same
transaction as the workflow step, or not at all.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class NoteKind(models.TextChoices):
    NEIGHBOUR_NOTICE = "neighbour_notice", "Neighbour notice"
    REJECTION = "rejection", "Rejection"
    CORRECTION = "correction", "Registry correction"
    REMARK = "remark", "Remark"


class DecisionNote(models.Model):
    """A note in the case file of an application, written inside the engine's transaction."""

    instance_id = models.BigIntegerField(help_text="The workflow instance that wrote it.")
    step_id = models.CharField(max_length=100)
    idempotency_key = models.CharField(max_length=80, unique=True)
    subject = models.CharField(
        max_length=100, help_text="The application or parcel the note is about."
    )
    kind = models.CharField(max_length=20, choices=NoteKind.choices)
    text = models.TextField()
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = _("decision note")
        verbose_name_plural = _("decision notes")
        ordering = ["-recorded_at", "-pk"]
        permissions = [("approve_permit", "Can approve or refuse building permits")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} on {self.subject}"
