"""Who must use a second factor, and which admin actions need one in this login.

A user is *privileged* when they can approve decisions, resolve incidents, publish
definitions, migrate instances, register webhooks, manage API keys or change anyone's
permissions (or are a superuser). The rule reads permissions, not group names, so a new
group that grants one of them is covered without a change here.
``GOVFLOW_REQUIRE_2FA_FOR_ALL`` makes every staff user privileged for this purpose.
"""

from __future__ import annotations

from django.conf import settings
from django.urls import reverse

PRIVILEGED_PERMISSIONS = frozenset(
    {
        "recovery.approve_decision",
        "recovery.request_decision",
        "recovery.resolve_incident",
        # Engine incidents are resolved with the operate permission (handoffs.services.incidents).
        "engine.operate_instance",
        "engine.publish_definition",
        "engine.migrate_instance",
        "events.add_subscription",
        "events.change_subscription",
        "events.delete_subscription",
        "api.add_apikey",
        "api.change_apikey",
        "api.delete_apikey",
        "auth.add_user",
        "auth.change_user",
        "auth.change_group",
        "auth.add_group",
        "auth.change_permission",
    }
)

# Admin URL names whose POST changes who may do what, or decides on someone's behalf. A POST
# to one of them without a second factor verified in this login is refused. The names are
# checked against the URL configuration by a test, so a rename cannot silently drop one.
GATED_URL_NAMES = frozenset(
    {
        # decisions: request, approve, reject; workflow approval nodes; engine incidents
        "engine_instance_handoff",
        "engine_instance_decision_approve",
        "engine_instance_decision_reject",
        "engine_instance_approval",
        "engine_instance_incident_resolve",
        # bulk triage: a batch of decisions requested, approved or rejected at once
        "handoffs_decisionbatch_submit",
        "handoffs_decisionbatch_approve",
        "handoffs_decisionbatch_reject",
        # compensations: a decision to compensate, and the outcome of an unknown one
        "engine_instance_cmp_request",
        "engine_instance_cmp_approve",
        "engine_instance_cmp_outcome_request",
        "engine_instance_cmp_outcome_approve",
        # contract migrations: requested, approved or rejected by a second person
        "engine_instance_migrate",
        "engine_instance_migration_approve",
        "engine_instance_migration_reject",
        # integrity incidents
        "recovery_integrityincident_resolution_request",
        "recovery_integrityincident_resolution_approve",
        "recovery_integrityincident_resolution_reject",
        # publishing definitions
        "engine_definition_upload",
        # webhooks: where every event of a tenant is sent, and the secret that signs it
        "events_subscription_add",
        "events_subscription_change",
        "events_subscription_delete",
        "events_subscription_rotate",
        # API keys, users, groups, second-factor devices of others
        "api_apikey_add",
        "api_apikey_change",
        "api_apikey_delete",
        "auth_user_add",
        "auth_user_change",
        "auth_user_delete",
        "auth_user_password_change",
        "auth_group_add",
        "auth_group_change",
        "auth_group_delete",
        "otp_totp_totpdevice_add",
        "otp_totp_totpdevice_change",
        "otp_totp_totpdevice_delete",
        "otp_static_staticdevice_add",
        "otp_static_staticdevice_change",
        "otp_static_staticdevice_delete",
        # confirming or rejecting someone else's grant (ADR 0025)
        "identity_rightschange_confirm",
        "identity_rightschange_reject",
    }
)


# A workflow's approval node names its own permission (any app's), so holding it cannot be
# told from the fixed list above: every approval needs a verified second factor.
ALWAYS_GATED_URL_NAMES = frozenset({"engine_instance_approval"})


def require_for_all() -> bool:
    return bool(getattr(settings, "GOVFLOW_REQUIRE_2FA_FOR_ALL", False))


def is_privileged(user) -> bool:
    """Whether ``user`` holds a right that needs a second factor (see the module doc)."""
    if user is None or not user.is_authenticated:
        return False
    if user.is_superuser:
        return True
    if require_for_all() and user.is_staff:
        return True
    return any(user.has_perm(perm) for perm in PRIVILEGED_PERMISSIONS)


def is_verified(user) -> bool:
    """Whether ``user`` proved a second factor in this login (set by django-otp)."""
    check = getattr(user, "is_verified", None)
    return bool(check and check())


def enrol_hint() -> str:
    """How to get a second factor, as the refusal message says it."""
    url = reverse("admin:identity_enrol")
    return (
        "This action needs a second factor verified in this login. If you have none yet, "
        f"set one up at {url} (an authenticator app, with recovery codes), then log out and "
        "log in again with your code. If you have one, log out and log in with your code."
    )
