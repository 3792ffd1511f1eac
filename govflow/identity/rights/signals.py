"""Every change of rights made through the ORM is recorded on the rights trail.

Membership of groups, permissions of users and groups (``m2m_changed``), superuser and
staff (``pre_save``/``post_save``), a deleted group's members (``pre_delete``); API keys
created and revoked are recorded by the API app (``govflow.api.rights``). These hooks only
*record*; whether a grant needs a second administrator is decided on the web paths (the
admin's forms and the confirmation service). So a change made in a shell, by a command or
by ``createsuperuser`` is never silent: it is a fact with ``via`` "orm" and no actor. Not
seen: ``QuerySet.update()`` and raw SQL on the user tables (docs/security.md).
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db.models.signals import m2m_changed, post_save, pre_delete, pre_save

from .policy import FLAGS, group_is_right, permission_label
from .trail import current, record

User = get_user_model()


def _on_user_groups(sender, instance, action, reverse, pk_set, **kwargs) -> None:
    pairs = _pairs(instance, action, reverse, pk_set, "groups", "user_set")
    if pairs is None:
        return
    added = action == "post_add"
    groups = {g.pk: g for g in Group.objects.filter(pk__in={g for _, g in pairs})}
    for user_pk, group_pk in sorted(pairs):
        group = groups.get(group_pk)
        record(
            "group_added" if added else "group_removed",
            user=user_pk,
            group=group_pk,
            group_name=group.name if group else "",
            right=bool(group and group_is_right(group)),
        )


def _on_user_permissions(sender, instance, action, reverse, pk_set, **kwargs) -> None:
    pairs = _pairs(instance, action, reverse, pk_set, "user_permissions", "user_set")
    if pairs is not None:
        _permission_facts(pairs, action, "user")


def _on_group_permissions(sender, instance, action, reverse, pk_set, **kwargs) -> None:
    pairs = _pairs(instance, action, reverse, pk_set, "permissions", "group_set")
    if pairs is not None:
        _permission_facts(pairs, action, "group")


def _permission_facts(pairs: set[tuple[int, int]], action: str, holder: str) -> None:
    perms = Permission.objects.select_related("content_type").in_bulk({p for _, p in pairs})
    for holder_pk, perm_pk in sorted(pairs):
        perm = perms.get(perm_pk)
        record(
            "permission_granted" if action == "post_add" else "permission_revoked",
            **{holder: holder_pk},
            permission=permission_label(perm) if perm else str(perm_pk),
        )


def _pairs(instance, action, reverse, pk_set, forward: str, backward: str):
    """(holder pk, target pk) pairs changed, oriented holder → target; None: nothing to
    record. A ``clear()`` is remembered before and recorded after, as removals."""
    if action == "pre_clear":
        related = getattr(instance, backward if reverse else forward)
        instance._govflow_cleared = set(related.values_list("pk", flat=True))
        return None
    if action == "post_clear":
        pk_set = getattr(instance, "_govflow_cleared", set())
        action = "post_remove"
    elif action not in ("post_add", "post_remove"):
        return None
    if not pk_set:
        return None
    if reverse:  # group.user_set.add(user), permission.group_set.add(group), …
        return {(pk, instance.pk) for pk in pk_set}
    return {(instance.pk, pk) for pk in pk_set}


def _on_user_pre_save(sender, instance, update_fields=None, **kwargs) -> None:
    if update_fields is not None and not set(update_fields) & set(FLAGS):
        return  # a login's last_login, a password change: no right moves
    old = None
    if instance.pk is not None:
        old = User.objects.filter(pk=instance.pk).values(*FLAGS).first()
    instance._govflow_old_flags = old


def _on_user_post_save(sender, instance, created, update_fields=None, **kwargs) -> None:
    if not hasattr(instance, "_govflow_old_flags"):
        return
    old = instance._govflow_old_flags or dict.fromkeys(FLAGS, False)
    del instance._govflow_old_flags
    changed = {f: getattr(instance, f) for f in FLAGS if bool(getattr(instance, f)) != old[f]}
    if not changed:
        return
    if created and current().actor_pk() is None:
        # createsuperuser, make run's demo setup: the first administrators come from the
        # command line, where no one could confirm them (ADR 0025).
        record("bootstrap", user=instance.pk, flags=sorted(f for f, v in changed.items() if v))
        return
    for flag, value in sorted(changed.items()):
        record("flag_set" if value else "flag_cleared", user=instance.pk, flag=flag)


def _on_group_pre_delete(sender, instance, **kwargs) -> None:
    members = sorted(instance.user_set.values_list("pk", flat=True))
    if members:
        record("group_deleted", group=instance.pk, group_name=instance.name, users=members)


def connect() -> None:
    """Connect the hooks (from ``IdentityConfig.ready``; the API's keys connect their own,
    ``govflow.api.rights``)."""
    uid = "govflow.identity.rights"
    m2m_changed.connect(_on_user_groups, sender=User.groups.through, dispatch_uid=f"{uid}.g")
    m2m_changed.connect(
        _on_user_permissions, sender=User.user_permissions.through, dispatch_uid=f"{uid}.up"
    )
    m2m_changed.connect(
        _on_group_permissions, sender=Group.permissions.through, dispatch_uid=f"{uid}.gp"
    )
    pre_save.connect(_on_user_pre_save, sender=User, dispatch_uid=f"{uid}.u1")
    post_save.connect(_on_user_post_save, sender=User, dispatch_uid=f"{uid}.u2")
    pre_delete.connect(_on_group_pre_delete, sender=Group, dispatch_uid=f"{uid}.gd")
