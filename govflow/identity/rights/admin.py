"""The admin's user and group pages with four eyes on grants (ADR 0025).

Saving a user or a group applies what takes rights away at once and turns what gives
rights into waiting *rights changes* (:mod:`.services`), which a second administrator
confirms on the rights-change pages (:mod:`.admin_changes`). The form refuses a change that
would give its own author a right. Every change, applied or waiting, is recorded on the
rights trail by the model hooks (:mod:`.signals`), attributed to the signed-in user.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.utils.translation import gettext as _

from govflow.identity.models import RightsChangeKind

from .policy import FLAGS, RightsDiff, group_grants, user_grants
from .services import rights_change_request, self_grant_message
from .tenants import TENANT_GROUP_PREFIX
from .words import gives_words

User = get_user_model()


class FourEyesForm:
    """Mixin of the user and group change forms: the grants it would make, self-grants refused."""

    requester = None  # set by the admin's get_form
    rights_diff = RightsDiff()

    def grants(self) -> RightsDiff:
        raise NotImplementedError

    def gives_requester(self) -> bool:
        raise NotImplementedError

    def clean(self):
        cleaned = super().clean()
        self.rights_diff = self.grants()
        if self.rights_diff and self.requester is not None and self.gives_requester():
            raise forms.ValidationError(self_grant_message(self.requester))
        return cleaned


def _four_eyes_form(base):
    class Form(FourEyesForm, base):
        pass

    Form.__name__ = base.__name__
    return Form


class RightsUserAdmin(UserAdmin):
    """Django's user pages; a grant waits for a second administrator."""

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        if obj is None:
            return form  # the add form sets a name and a password only
        return type(
            form.__name__,
            (_four_eyes_form(form),),
            {"requester": request.user, "grants": _user_form_grants, "gives_requester": _is_self},
        )

    def save_model(self, request, obj, form, change):
        for flag in getattr(form, "rights_diff", RightsDiff()).flags_granted:
            setattr(obj, flag, False)  # applied when a second administrator confirms
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        diff = getattr(form, "rights_diff", RightsDiff())
        held = {"groups": diff.groups_granted, "user_permissions": diff.permissions_granted}
        for name, waiting in held.items():
            if name in form.cleaned_data and waiting:
                form.cleaned_data[name] = [x for x in form.cleaned_data[name] if x not in waiting]
        super().save_related(request, form, formsets, change)
        _request_all(request, diff, user=form.instance)


def _user_form_grants(form) -> RightsDiff:
    data = form.cleaned_data
    return user_grants(
        form.instance,
        groups=data.get("groups"),
        permissions=data.get("user_permissions"),
        flags={f: data[f] for f in FLAGS if f in data},
    )


def _is_self(form) -> bool:
    return form.instance.pk == form.requester.pk


class RightsGroupAdmin(GroupAdmin):
    """Django's group pages; a permission that is a right waits for a second administrator,
    and a group is not renamed into or out of a tenant (its name is the tenant)."""

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        return type(
            form.__name__,
            (_four_eyes_form(form),),
            {
                "requester": request.user,
                "grants": _group_form_grants,
                "gives_requester": _member,
                "clean_name": _clean_group_name,
            },
        )

    def save_related(self, request, form, formsets, change):
        diff = getattr(form, "rights_diff", RightsDiff())
        if diff.permissions_granted and "permissions" in form.cleaned_data:
            waiting = diff.permissions_granted
            form.cleaned_data["permissions"] = [
                p for p in form.cleaned_data["permissions"] if p not in waiting
            ]
        super().save_related(request, form, formsets, change)
        _request_all(request, diff, group=form.instance)


def _clean_group_name(form) -> str:
    """A tenant group's name is its members' tenant: renaming a group into, out of or
    between ``tenant:`` names would give or take a tenant from every member at once, with no
    rights change for a second administrator to confirm. Refused; a new group is the way."""
    name = form.cleaned_data.get("name", "")
    old = form.instance.name if form.instance.pk else None
    if old is None or name == old:
        return name
    if old.startswith(TENANT_GROUP_PREFIX) or name.startswith(TENANT_GROUP_PREFIX):
        raise forms.ValidationError(_rename_refused(old, name), code="tenant_group_rename")
    return name


def _rename_refused(old: str, new: str) -> str:
    return _(
        "The group “%(old)s” cannot be renamed to “%(new)s”: a group named "
        "“%(prefix)s<tenant>” gives its members that tenant, so the rename would change the "
        "tenants of all its members without a second administrator. Nothing was saved. "
        "Create a group with the new name instead and add the members to it (each addition "
        "waits for a second administrator); then remove them from the old one."
    ) % {"old": old, "new": new, "prefix": TENANT_GROUP_PREFIX}


def _group_form_grants(form) -> RightsDiff:
    return group_grants(form.instance, permissions=form.cleaned_data.get("permissions"))


def _member(form) -> bool:
    group = form.instance
    return bool(group.pk) and group.user_set.filter(pk=form.requester.pk).exists()


def _request_all(request, diff: RightsDiff, *, user=None, group=None) -> None:
    """Record each held-back grant as a waiting rights change, and say so."""
    if not diff:
        return
    by = request.user
    for g in diff.groups_granted:
        rights_change_request(requested_by=by, kind=RightsChangeKind.GROUP_ADD, user=user, group=g)
    for p in diff.permissions_granted:
        rights_change_request(
            requested_by=by,
            kind=RightsChangeKind.PERMISSION_GRANT,
            user=user,
            group=group,
            permission=p,
        )
    for f in diff.flags_granted:
        rights_change_request(requested_by=by, kind=RightsChangeKind.FLAG_SET, user=user, flag=f)
    holder = str(user) if user is not None else str(group)
    messages.warning(request, gives_words(holder, diff))


def install() -> None:
    """Replace the stock user and group pages (from the identity app's ``admin`` module)."""
    for model, model_admin in ((User, RightsUserAdmin), (Group, RightsGroupAdmin)):
        if admin.site.is_registered(model):
            admin.site.unregister(model)
        admin.site.register(model, model_admin)
