"""API keys in the admin: create (the key is shown once), scope, expire, revoke.

The key is hashed at rest; the page that answers the creation shows it once, rendered
directly (it is never put in a message, a cookie or the session). Revoking is final and
is how a key ends: keys are not deleted, so what they did stays attributable.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.http import Http404
from django.template.response import TemplateResponse
from django.utils import timezone
from rest_framework_api_key.admin import APIKeyModelAdmin
from rest_framework_api_key.models import APIKey

from govflow.engine.tenancy import scope, tenants_of

from .models import ApiKey
from .scopes import SCOPES, TASK_SCOPE

# The library's stock key model is not used: GovFlow's keys carry a tenant and scopes.
if admin.site.is_registered(APIKey):
    admin.site.unregister(APIKey)


class ApiKeyForm(forms.ModelForm):
    scope_choices = forms.MultipleChoiceField(
        label="Scopes",
        required=False,
        choices=[(name, f"{name} — {text}") for name, (_, text) in SCOPES.items()],
        widget=forms.CheckboxSelectMultiple,
        help_text="What the key may do. Give an integration only what it needs.",
    )
    task_topics = forms.CharField(
        label="External-task topics",
        required=False,
        help_text="Topics whose external tasks the key may fetch, lock and report on "
        "(/api/v1/tasks/…), separated by commas; each becomes the scope tasks:<topic>.",
    )

    class Meta:
        model = ApiKey
        fields = ["name", "tenant", "expiry_date", "revoked"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        scopes = list(self.instance.scopes or []) if self.instance.pk else []
        self.fields["scope_choices"].initial = [s for s in scopes if s in SCOPES]
        self.fields["task_topics"].initial = ", ".join(
            s.split(":", 1)[1] for s in scopes if s.startswith("tasks:")
        )

    def clean_task_topics(self) -> list[str]:
        topics = [t.strip() for t in self.cleaned_data["task_topics"].split(",") if t.strip()]
        bad = [t for t in topics if not TASK_SCOPE.match(f"tasks:{t}")]
        if bad:
            raise forms.ValidationError(
                f"Not a topic: {', '.join(bad)}. Topics are letters, digits, '.', '_' and '-'."
            )
        return topics

    tenants: frozenset[str] | None = None  # the admin's user's; None: every tenant

    def clean_tenant(self) -> str:
        tenant = self.cleaned_data["tenant"]
        if self.tenants is not None and tenant not in self.tenants:
            raise forms.ValidationError(
                f"You do not work for the tenant {tenant!r}; a key can be made only for "
                f"your tenants: {', '.join(sorted(self.tenants)) or 'none'}."
            )
        return tenant

    def clean(self):
        cleaned = super().clean()
        scopes = list(cleaned.get("scope_choices") or [])
        scopes += [f"tasks:{t}" for t in cleaned.get("task_topics") or []]
        self.instance.scopes = sorted(set(scopes))
        return cleaned


@admin.register(ApiKey)
class ApiKeyAdmin(APIKeyModelAdmin):
    form = ApiKeyForm
    list_display = (
        "prefix",
        "name",
        "tenant",
        "scope_list",
        "created",
        "expiry_date",
        "last_used_at",
        "_has_expired",
        "revoked",
    )
    list_filter = ("tenant", "revoked", "created")
    search_fields = ("name", "prefix", "tenant")
    actions = ["revoke"]

    def get_queryset(self, request):
        """Only the keys of the user's tenants (ADR 0018)."""
        return scope(super().get_queryset(request), request.user)

    def get_form(self, request, obj=None, change=False, **kwargs):
        """The form refuses a tenant the user does not work for (ADR 0018)."""
        form = super().get_form(request, obj, change, **kwargs)
        return type(form.__name__, (form,), {"tenants": tenants_of(request.user)})

    def _get_obj_does_not_exist_redirect(self, request, opts, object_id):
        """Another tenant's key, or none, is 404 (not a redirect home)."""
        raise Http404(f"No API key has id {object_id}.")

    def get_fieldsets(self, request, obj=None):
        main = ["name", "tenant", "scope_choices", "task_topics", "expiry_date"]
        if obj is not None:
            main = ["prefix", *main, "revoked", "created", "created_by", "last_used_at"]
        return [(None, {"fields": main})]

    def get_readonly_fields(self, request, obj=None):
        fields = ["prefix", "created", "created_by", "last_used_at"]
        if obj is not None and obj.revoked:
            fields += ["name", "tenant", "expiry_date", "revoked"]
        return fields

    @admin.display(description="Scopes")
    def scope_list(self, obj: ApiKey) -> str:
        return ", ".join(obj.scopes or []) or "—"

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # revoke instead: what a key did stays attributable

    def save_model(self, request, obj: ApiKey, form, change: bool) -> None:
        if change:
            obj.save()
            return
        obj.created_by = request.user
        request._govflow_new_api_key = ApiKey.objects.assign_key(obj)
        obj.save()

    def response_add(self, request, obj: ApiKey, post_url_continue=None):
        key = getattr(request, "_govflow_new_api_key", None)
        if key is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"API key {obj.name!r} created",
            "api_key": obj,
            "key": key,
        }
        response = TemplateResponse(request, "admin/api/apikey/created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke the selected API keys (final)")
    def revoke(self, request, queryset) -> None:
        count = 0
        for key in queryset.filter(revoked=False):
            key.revoked = True
            key.save(update_fields=["revoked"])  # each revocation goes on the rights trail
            count += 1
        self.message_user(
            request,
            f"{count} API key(s) revoked at {timezone.now():%Y-%m-%d %H:%M} UTC; requests "
            "with them are refused from now on.",
            messages.SUCCESS,
        )
