"""API models: integration keys and the stored answers of idempotent requests."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils.translation import gettext_lazy as _
from rest_framework_api_key.models import AbstractAPIKey, BaseAPIKeyManager

from .scopes import scope_problem


class ApiKeyManager(BaseAPIKeyManager):
    pass


class ApiKey(AbstractAPIKey):
    """A key an integration authenticates with: one tenant, a set of scopes.

    The key itself is shown once, when it is created; only its prefix (its public id)
    and a hash are stored. Revoking is final; an expiry date ends it by itself.
    """

    objects = ApiKeyManager()

    tenant = models.CharField(
        max_length=100,
        help_text="The tenant (organisation or office) this key acts for. It sees and "
        "changes that tenant's instances only.",
    )
    scopes = models.JSONField(
        default=list,
        blank=True,
        help_text="What the key may do, e.g. instances:start, instances:read.",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        editable=False,
    )
    last_used_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="Updated at most once a minute."
    )

    class Meta(AbstractAPIKey.Meta):
        db_table = "api_key"
        verbose_name = _("API key")
        verbose_name_plural = _("API keys")

    def clean(self) -> None:
        super().clean()
        problems = [p for p in map(scope_problem, self.scopes or []) if p]
        if not isinstance(self.scopes, list):
            problems = ["Scopes are a list of scope names."]
        if problems:
            raise ValidationError({"scopes": problems})
        if not (self.tenant or "").strip():
            raise ValidationError({"tenant": "Name the tenant this key acts for."})


class IdempotencyState(models.TextChoices):
    IN_PROGRESS = "in_progress", "In progress"
    COMPLETED = "completed", "Completed"
    INTERRUPTED = "interrupted", "Interrupted (outcome unknown)"


class IdempotencyRecord(models.Model):
    """The first request made with an ``Idempotency-Key``, and the answer it got.

    Unique per owner (an API key, or a signed-in user) and key: two requests racing with
    the same key cannot both insert, so only one of them runs.
    """

    owner = models.CharField(max_length=120)
    key = models.CharField(max_length=255)
    method = models.CharField(max_length=10)
    path = models.CharField(max_length=400)
    request_fp = models.CharField(
        max_length=64, help_text="BLAKE3 of the canonical method, path and body."
    )
    state = models.CharField(
        max_length=12, choices=IdempotencyState.choices, default=IdempotencyState.IN_PROGRESS
    )
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response_data = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    response_headers = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("idempotency record")
        verbose_name_plural = _("idempotency records")
        db_table = "api_idempotency_record"
        constraints = [
            models.UniqueConstraint(fields=["owner", "key"], name="api_idempotency_owner_key"),
        ]
        indexes = [models.Index(fields=["created_at"], name="api_idempotency_created")]

    def __str__(self) -> str:
        return f"{self.method} {self.path} with key {self.key[:20]} ({self.state})"
