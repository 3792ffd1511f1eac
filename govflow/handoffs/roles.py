"""The desk's roles and their permissions (ADR 0018, docs/deployment.md "Roles and tenants").

The migration ``handoffs.0001_desk_roles`` installs them; ``demo_setup`` installs them again
(a test database flushed between tests has lost them, and the demo logins need them).
"""

from __future__ import annotations

ENGINE_RECORDS = ["definition", "instance", "token", "timer", "triggerdelivery", "incident"]
RECOVERY_RECORDS = ["operation", "checkpoint", "lease", "integrityincident", "decision"]
VIEW_ENGINE = [("engine", f"view_{model}") for model in ENGINE_RECORDS]
VIEW_RECOVERY = [("recovery", f"view_{model}") for model in RECOVERY_RECORDS]

# Webhooks (ADR 0032): operators see deliveries and deliver dead letters again; auditors
# read the outbox; administrators register webhooks.
VIEW_EVENTS = [
    ("events", "view_event"),
    ("events", "view_subscription"),
    ("events", "view_delivery"),
]

OPERATOR = [
    *VIEW_ENGINE,
    ("events", "view_subscription"),
    ("events", "view_delivery"),
    ("events", "redeliver_delivery"),
    ("recovery", "view_operation"),
    ("recovery", "view_decision"),
    ("recovery", "view_integrityincident"),
    ("engine", "start_instance"),
    ("engine", "operate_instance"),
    ("engine", "migrate_instance"),
    ("recovery", "request_decision"),
]
APPROVER = [
    *VIEW_ENGINE,
    ("recovery", "view_operation"),
    ("recovery", "view_decision"),
    ("recovery", "view_integrityincident"),
    ("engine", "migrate_instance"),
    ("recovery", "approve_decision"),
    ("recovery", "resolve_incident"),
]
AUDITOR = [*VIEW_ENGINE, *VIEW_RECOVERY, *VIEW_EVENTS, ("api", "view_apikey")]
ADMINISTRATOR = [
    *AUDITOR,
    ("engine", "publish_definition"),
    ("engine", "start_instance"),
    ("engine", "operate_instance"),
    ("api", "add_apikey"),
    ("api", "change_apikey"),
    ("events", "add_subscription"),
    ("events", "change_subscription"),
    ("events", "redeliver_delivery"),
    ("auth", "view_user"),
    ("auth", "add_user"),
    ("auth", "change_user"),
    ("auth", "view_group"),
    ("auth", "change_group"),
]
ROLES = {
    "Operator": OPERATOR,
    "Approver": APPROVER,
    "Auditor": AUDITOR,
    "Administrator": ADMINISTRATOR,
}


def roles_install(
    group_model, permission_model, *, skip_apps: frozenset[str] = frozenset()
) -> None:
    """Create each role's group (if missing) and set its permissions to the mapping; the
    permissions must exist (``migrate`` creates them). ``skip_apps``: apps whose
    permissions a migration cannot grant yet (their models come later), left out."""
    for name, perms in ROLES.items():
        group, _ = group_model.objects.get_or_create(name=name)
        found = [
            permission_model.objects.get(content_type__app_label=app, codename=code)
            for app, code in perms
            if app not in skip_apps
        ]
        group.permissions.set(found)
