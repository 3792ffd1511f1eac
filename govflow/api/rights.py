"""API keys created and revoked go on the rights trail (docs/security.md, "Rights changes").

A key is a credential that acts for a tenant: making one, and ending one, is a change of
who may do what. Recorded from the model, so the admin, ``api_key_create`` and a shell
are all covered; the admin's revoke action saves each key for this reason.
"""

from __future__ import annotations

from django.db.models.signals import post_save, pre_save

from govflow.identity.rights.trail import record

from .models import ApiKey


def _on_api_key_pre_save(sender, instance, update_fields=None, **kwargs) -> None:
    if update_fields is not None and "revoked" not in update_fields:
        return
    old = sender.objects.filter(pk=instance.pk).values_list("revoked", flat=True).first()
    instance._govflow_was_revoked = old


def _on_api_key_post_save(sender, instance, created, **kwargs) -> None:
    was = instance.__dict__.pop("_govflow_was_revoked", True)
    if created:
        record(
            "api_key_created",
            key=instance.prefix,
            tenant=instance.tenant,
            scopes=sorted(instance.scopes or []),
            created_by=instance.created_by_id,
        )
    elif instance.revoked and not was:
        record("api_key_revoked", key=instance.prefix, tenant=instance.tenant)


def connect() -> None:
    """Connect the hooks (from ``ApiConfig.ready``)."""
    pre_save.connect(_on_api_key_pre_save, sender=ApiKey, dispatch_uid="govflow.api.rights.1")
    post_save.connect(_on_api_key_post_save, sender=ApiKey, dispatch_uid="govflow.api.rights.2")
