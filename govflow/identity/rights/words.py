"""Rights changes in words, for messages and pages (translatable)."""

from __future__ import annotations

from django.utils.translation import gettext as _

from .tenants import TENANT_GROUP_PREFIX


def flag_words(flag: str) -> str:
    return {"is_superuser": _("superuser status"), "is_staff": _("staff status")}.get(flag, flag)


def group_words(name: str) -> str:
    if name.startswith(TENANT_GROUP_PREFIX):
        return _("the tenant %(tenant)s") % {"tenant": name[len(TENANT_GROUP_PREFIX) :]}
    return _("the %(group)s role") % {"group": name}


def change_words(change) -> str:
    """ "ada joins the Approver role", "Operator gets engine.publish_definition", …"""
    from .policy import permission_label

    kind = change.kind
    if kind == "group_add":
        return _("%(user)s joins %(what)s") % {
            "user": change.user,
            "what": group_words(change.group.name),
        }
    if kind == "flag_set":
        return _("%(user)s gets %(what)s") % {"user": change.user, "what": flag_words(change.flag)}
    holder = change.user if change.user_id else _("the group %(group)s") % {"group": change.group}
    return _("%(holder)s gets the permission %(perm)s") % {
        "holder": holder,
        "perm": permission_label(change.permission),
    }


def gives_words(holder: str, diff) -> str:
    """ "This change gives ada the Approver role and staff status; …" (a grant that waits)."""
    parts = [group_words(g.name) for g in diff.groups_granted]
    parts += [_("the permission %(perm)s") % {"perm": p} for p in _labels(diff)]
    parts += [flag_words(f) for f in diff.flags_granted]
    return _(
        "This change gives %(holder)s %(what)s; it takes effect when a second administrator "
        "confirms it under Rights changes (Identity and access → Rights changes)."
    ) % {"holder": holder, "what": ", ".join(parts)}


def _labels(diff) -> list[str]:
    from .policy import permission_label

    return [permission_label(p) for p in diff.permissions_granted]
