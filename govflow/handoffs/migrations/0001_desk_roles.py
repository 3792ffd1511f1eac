"""The desk's roles as groups with their permissions (ADR 0018, docs/deployment.md "Roles").

Permissions are created after migrations (post_migrate), so this migration creates the ones
it grants first. Re-running it (or a later version of this mapping) sets each role's
permissions to exactly the mapping; tenant groups (``tenant:<name>``) are not touched.
"""

from django.db import migrations

ENGINE_RECORDS = ["definition", "instance", "token", "timer", "triggerdelivery", "incident"]
RECOVERY_RECORDS = ["operation", "checkpoint", "lease", "integrityincident", "decision"]
VIEW_ENGINE = [("engine", f"view_{model}") for model in ENGINE_RECORDS]
VIEW_RECOVERY = [("recovery", f"view_{model}") for model in RECOVERY_RECORDS]

OPERATOR = [
    *VIEW_ENGINE,
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
AUDITOR = [*VIEW_ENGINE, *VIEW_RECOVERY, ("api", "view_apikey")]
ADMINISTRATOR = [
    *AUDITOR,
    ("engine", "publish_definition"),
    ("engine", "start_instance"),
    ("engine", "operate_instance"),
    ("api", "add_apikey"),
    ("api", "change_apikey"),
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


def create_roles(apps, schema_editor):
    from django.apps import apps as global_apps
    from django.contrib.auth.management import create_permissions

    for config in global_apps.get_app_configs():
        create_permissions(config, verbosity=0, apps=apps, using=schema_editor.connection.alias)
    group_model = apps.get_model("auth", "Group")
    permission_model = apps.get_model("auth", "Permission")
    for name, perms in ROLES.items():
        group, _ = group_model.objects.get_or_create(name=name)
        found = [
            permission_model.objects.get(content_type__app_label=app, codename=code)
            for app, code in perms
        ]
        group.permissions.set(found)


def drop_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("engine", "0007_delivery_tenant"),
        ("recovery", "0006_decision_result"),
        ("api", "0001_initial"),
    ]

    operations = [migrations.RunPython(create_roles, drop_roles)]
