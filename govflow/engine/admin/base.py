"""Shared pieces of the engine's admin pages."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.utils.html import format_html


class BoundedChangeList(ChangeList):
    """Django's list, with a date outside what Python's dates hold (``?created_at__year=
    9999`` or ``99999999999``) refused like any other bad filter (the list again, with
    Django's "?e=1" notice) instead of failing the request: its date-hierarchy bounds
    catch only a ``ValueError`` of the first date, not the next year's or an overflow."""

    def get_filters(self, request):
        try:
            return super().get_filters(request)
        except (ValueError, OverflowError) as e:
            raise IncorrectLookupParameters(e) from e


class ReadOnlyAdmin(admin.ModelAdmin):
    """Visible to those with the view permission; nobody adds, edits or deletes rows here."""

    def get_changelist(self, request, **kwargs):
        return BoundedChangeList

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def _get_obj_does_not_exist_redirect(self, request, opts, object_id):
        """A row the user may not see (another tenant's) or that does not exist is 404,
        not the stock redirect to the home page (ADR 0018)."""
        raise Http404(f"No {opts.verbose_name} has id {object_id}.")


def require(request, *perms: str) -> None:
    """Refuse with 403 unless the user holds every permission in ``perms``."""
    if not request.user.has_perms(perms):
        raise PermissionDenied


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def pre(value: Any):
    """A JSON value as an escaped, pretty-printed ``<pre>`` block."""
    return format_html('<pre class="govflow-json">{}</pre>', pretty_json(value))


def short(fingerprint: str, length: int = 12) -> str:
    return f"{fingerprint[:length]}…" if fingerprint else ""
