"""What counts as a right, and what a change of a user's or a group's rights gives.

A *right* is anything that lets its holder change something or act for a tenant: every
permission except the ``view_*`` ones, membership of a group that carries such a
permission, membership of a tenant group (``tenant:<name>``), superuser and staff. The rule
reads permissions, not group names: a new group that grants ``recovery.approve_decision``
is covered without a change here. Giving a right waits for a second administrator;
taking one away applies at once (ADR 0025).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from django.contrib.auth.models import Group, Permission

from .tenants import TENANT_GROUP_PREFIX

FLAGS = ("is_superuser", "is_staff")


def permission_is_right(permission: Permission) -> bool:
    """Every permission but reading (``view_*``) is a right."""
    return not permission.codename.startswith("view_")


def permission_label(permission: Permission) -> str:
    return f"{permission.content_type.app_label}.{permission.codename}"


def group_is_right(group: Group) -> bool:
    """A tenant group, or a group that carries a permission other than reading."""
    if group.name.startswith(TENANT_GROUP_PREFIX):
        return True
    return group.permissions.exclude(codename__startswith="view_").exists()


@dataclass
class RightsDiff:
    """What a form's submission changes: the grants that wait, the rest that applies."""

    groups_granted: list[Group] = field(default_factory=list)
    permissions_granted: list[Permission] = field(default_factory=list)
    flags_granted: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.groups_granted or self.permissions_granted or self.flags_granted)

    def words(self) -> list[str]:
        from .words import flag_words

        return [
            *(str(g.name) for g in self.groups_granted),
            *(permission_label(p) for p in self.permissions_granted),
            *(flag_words(f) for f in self.flags_granted),
        ]


def user_grants(
    user, *, groups: Iterable[Group] | None, permissions: Iterable[Permission] | None, flags: dict
) -> RightsDiff:
    """The rights a submitted user form would give ``user`` (its stored state is the old)."""
    diff = RightsDiff()
    if groups is not None:
        old = set(user.groups.values_list("pk", flat=True)) if user.pk else set()
        diff.groups_granted = [g for g in groups if g.pk not in old and group_is_right(g)]
    if permissions is not None:
        diff.permissions_granted = _new_rights(
            permissions, user.user_permissions if user.pk else None
        )
    for flag, value in flags.items():
        if value and not getattr(user, flag, False):
            diff.flags_granted.append(flag)
    return diff


def group_grants(group: Group, *, permissions: Iterable[Permission] | None) -> RightsDiff:
    """The rights a submitted group form would give ``group`` (and so its members)."""
    if permissions is None:
        return RightsDiff()
    return RightsDiff(
        permissions_granted=_new_rights(permissions, group.permissions if group.pk else None)
    )


def _new_rights(permissions: Iterable[Permission], manager) -> list[Permission]:
    old = set(manager.values_list("pk", flat=True)) if manager is not None else set()
    return [p for p in permissions if p.pk not in old and permission_is_right(p)]
