"""Dataflow's own rows: its runs, their publications, and the demo's fault switch."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class RunState(models.TextChoices):
    RUNNING = "running", _("Running")
    PUBLISHED = "published", _("Published")
    FAILED = "failed", _("Failed")
    UNKNOWN_PUBLICATION = "unknown_publication", _("Publication outcome unknown")
    CANCELLED = "cancelled", _("Cancelled")


class FaultMode(models.TextChoices):
    NONE = "", _("None: publish normally")
    HOLD = "hold", _("Hold: leave new runs running until published by hand")
    LOST_ANSWER = "lost_answer", _("Lost answer: publish, then lose the catalogue's answer")
    LOST_REQUEST = "lost_request", _("Lost request: lose the request before it is published")
    REJECT = "reject", _("Reject: the catalogue refuses the publication")


class DataflowRun(models.Model):
    """One run: a dataset to publish, keyed by the caller's idempotency key."""

    idempotency_key = models.CharField(max_length=200, unique=True)
    dataset = models.CharField(max_length=200)
    rows = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=20, choices=RunState.choices, default=RunState.RUNNING)
    reason_code = models.CharField(max_length=100, blank=True, default="")
    operation_key = models.CharField(
        max_length=80, blank=True, default="", help_text="The publication's ledger operation."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("dataflow run")
        verbose_name_plural = _("dataflow runs")

    def __str__(self) -> str:
        return f"{self.reference} {self.dataset} ({self.state})"

    @property
    def reference(self) -> str:
        return f"DF-{self.pk:05d}"


class Publication(models.Model):
    """The effect: a dataset entered in the (demo) open-data catalogue."""

    run = models.OneToOneField(DataflowRun, on_delete=models.CASCADE, related_name="publication")
    catalogue_id = models.CharField(max_length=40, unique=True)
    published_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = _("publication")
        verbose_name_plural = _("publications")

    def __str__(self) -> str:
        return self.catalogue_id


class FaultSwitch(models.Model):
    """What goes wrong with the next publications (one row; for the demo and tests)."""

    mode = models.CharField(max_length=20, choices=FaultMode.choices, blank=True, default="")

    class Meta:
        verbose_name = _("fault switch")
        verbose_name_plural = _("fault switch")

    def __str__(self) -> str:
        return str(self.get_mode_display())
