"""Four eyes on rights: a grant is requested by one administrator and applied only when
another confirms it (ADR 0025).

``rights_change_request`` runs inside the admin's change transaction (the rest of the
form's changes commit with the request); ``rights_change_confirm`` and
``rights_change_reject`` are their own transactions. The confirmation applies the grant
and records it on the rights trail in one commit.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models.functions import Now
from django.utils.translation import gettext as _

from govflow.identity.models import RightsChange, RightsChangeKind, RightsChangeState

from .policy import permission_label
from .trail import acting, record
from .words import change_words


class RightsChangeError(Exception):
    """The change cannot be requested, confirmed or rejected; the message says why."""


def rights_change_request(
    *,
    requested_by,
    kind: str,
    user=None,
    group=None,
    permission=None,
    flag: str = "",
) -> RightsChange:
    """Record a grant that waits for a second administrator; nothing is applied. The same
    grant already waiting (a form saved twice) is that change, not a second one."""
    if user is not None and user.pk == requested_by.pk:
        raise RightsChangeError(self_grant_message(user))
    with transaction.atomic():
        waiting = RightsChange.objects.filter(
            state=RightsChangeState.PENDING,
            kind=kind,
            user=user,
            group=group,
            permission=permission,
            flag=flag,
        ).first()
        if waiting is not None:
            return waiting
        change = RightsChange.objects.create(
            kind=kind,
            user=user,
            group=group,
            permission=permission,
            flag=flag,
            requested_by=requested_by,
        )
        record("change_requested", **_what(change), requested_by=requested_by.pk)
    return change


def self_grant_message(user) -> str:
    return _(
        "No one grants rights to themselves: this change would give you (%(user)s) a right. "
        "Ask another administrator to request it; a second one confirms it."
    ) % {"user": user}


def confirm_permission(change: RightsChange) -> str:
    """The permission a confirming administrator needs for ``change``."""
    return "auth.change_user" if change.user_id else "auth.change_group"


def rights_change_confirm(*, change_id: int, actor) -> RightsChange:
    """Apply a waiting grant on a second administrator's word, with its fact, in one commit."""
    with transaction.atomic(durable=True):
        change = _pending(change_id)
        _check_confirmer(change, actor)
        moved = RightsChange.objects.filter(pk=change.pk, state=RightsChangeState.PENDING).update(
            state=RightsChangeState.CONFIRMED, decided_by=actor, decided_at=Now()
        )
        if moved != 1:
            raise RightsChangeError(_decided_message(change_id))
        with acting(actor, via="confirmed", change=change.pk, requested_by=change.requested_by_id):
            record(
                "change_confirmed",
                **_what(change),
                requested_by=change.requested_by_id,
                confirmed_by=actor.pk,
            )
            _apply(change)
        change.refresh_from_db()
    return change


def rights_change_reject(*, change_id: int, actor, note: str = "") -> RightsChange:
    """Refuse a waiting grant (another administrator, or the requester taking it back)."""
    with transaction.atomic(durable=True):
        change = _pending(change_id)
        if actor.pk != change.requested_by_id and not _may_decide(change, actor):
            raise RightsChangeError(_missing_permission(change))
        moved = RightsChange.objects.filter(pk=change.pk, state=RightsChangeState.PENDING).update(
            state=RightsChangeState.REJECTED, decided_by=actor, decided_at=Now(), note=note
        )
        if moved != 1:
            raise RightsChangeError(_decided_message(change_id))
        with acting(actor, via="admin"):
            record("change_rejected", change=change.pk, rejected_by=actor.pk)
        change.refresh_from_db()
    return change


def _pending(change_id: int) -> RightsChange:
    change = (
        RightsChange.objects.select_for_update(of=("self",))
        .select_related("user", "group", "permission__content_type", "requested_by")
        .filter(pk=change_id)
        .first()
    )
    if change is None:
        raise RightsChangeError(_("There is no rights change #%(id)s.") % {"id": change_id})
    if change.state != RightsChangeState.PENDING:
        raise RightsChangeError(_decided_message(change_id))
    return change


def _decided_message(change_id: int) -> str:
    return _(
        "Rights change #%(id)s was already confirmed or rejected; nothing was changed. "
        "Reload the list of rights changes to see who decided it."
    ) % {"id": change_id}


def _may_decide(change: RightsChange, actor) -> bool:
    if change.kind == RightsChangeKind.FLAG_SET and change.flag == "is_superuser":
        return actor.is_superuser
    return actor.has_perm(confirm_permission(change))


def _missing_permission(change: RightsChange) -> str:
    if change.kind == RightsChangeKind.FLAG_SET and change.flag == "is_superuser":
        return _("Only a superuser may confirm or reject making someone a superuser.")
    return _("You may not decide this rights change: the permission %(perm)s is required.") % {
        "perm": confirm_permission(change)
    }


def _check_confirmer(change: RightsChange, actor) -> None:
    if actor.pk == change.requested_by_id:
        raise RightsChangeError(
            _(
                "You requested this change, so you cannot confirm it: a second administrator "
                "confirms it (four eyes on rights). You may reject it to take it back."
            )
        )
    if change.user_id == actor.pk or (
        change.group_id
        and not change.user_id
        and change.group.user_set.filter(pk=actor.pk).exists()
    ):
        raise RightsChangeError(
            _(
                "This change gives you a right (%(what)s), so you cannot confirm it: another "
                "administrator must."
            )
            % {"what": change_words(change)}
        )
    if not _may_decide(change, actor):
        raise RightsChangeError(_missing_permission(change))


def _apply(change: RightsChange) -> None:
    if change.kind == RightsChangeKind.GROUP_ADD:
        change.user.groups.add(change.group)
    elif change.kind == RightsChangeKind.PERMISSION_GRANT:
        holder = change.user.user_permissions if change.user_id else change.group.permissions
        holder.add(change.permission)
    else:
        user = get_user_model().objects.get(pk=change.user_id)
        setattr(user, change.flag, True)
        user.save(update_fields=[change.flag])


def _what(change: RightsChange) -> dict:
    what = {"change": change.pk, "kind": str(change.kind), "user": change.user_id}
    if change.group_id:
        what["group"] = change.group_id
        what["group_name"] = change.group.name
    if change.permission_id:
        what["permission"] = permission_label(change.permission)
    if change.flag:
        what["flag"] = change.flag
    return what
