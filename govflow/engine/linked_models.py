"""What the engine keeps about a linked run: the other module's reference and answers.

One row per started run, written on the instance's fence in the commit that recorded the
start's success (or its confirmation) and in each commit that took a descriptor. The
descriptors' fingerprints are facts on the instance's chain as well
(``linked_run.described``), so the first conclusive one cannot be edited away unseen.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

__all__ = ["LinkedRun", "LinkedState"]


class LinkedState(models.TextChoices):
    STARTED = "started", _("Started (not described yet)")
    RUNNING = "running", _("Running")
    SUCCEEDED = "succeeded", _("Succeeded")
    FAILED = "failed", _("Failed")
    UNKNOWN_PUBLICATION = "unknown_publication", _("Publication outcome unknown")
    CONTRADICTED = "contradicted", _("Contradicted an earlier conclusive answer")


class LinkedRun(models.Model):
    """A run another module carries out for a ``linked_run`` step."""

    instance = models.ForeignKey(
        "engine.Instance", on_delete=models.CASCADE, related_name="linked_runs"
    )
    start_token = models.OneToOneField(
        "engine.Token", on_delete=models.CASCADE, related_name="linked_start"
    )
    watch_token = models.OneToOneField(
        "engine.Token", on_delete=models.CASCADE, related_name="linked_watch"
    )
    node_id = models.CharField(max_length=100)
    provider = models.CharField(max_length=200)
    run_ref = models.CharField(max_length=200)
    operation_key = models.CharField(max_length=80)
    state = models.CharField(
        max_length=20, choices=LinkedState.choices, default=LinkedState.STARTED
    )
    outputs = models.JSONField(null=True, blank=True)
    reason_code = models.CharField(max_length=200, blank=True, default="")
    note = models.TextField(blank=True, default="")
    concluded = models.CharField(
        max_length=64,
        blank=True,
        default="",
        help_text="Fingerprint of the first conclusive descriptor; a later one must equal it.",
    )
    polls = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField()
    described_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("linked run")
        verbose_name_plural = _("linked runs")
        db_table = "engine_linked_run"

    def __str__(self) -> str:
        return f"{self.provider} run {self.run_ref} ({self.state})"
