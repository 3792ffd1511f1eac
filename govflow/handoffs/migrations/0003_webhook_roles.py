"""The desk's roles gain the outbox's permissions (ADR 0032): operators deliver dead-lettered
webhook events again, auditors read the outbox, administrators register webhooks.

Runs the roles' mapping again (``0001_desk_roles``), now that the outbox's models exist.
"""

from django.db import migrations

from govflow.handoffs.roles import ROLES, roles_install


def grant(apps, schema_editor):
    from django.apps import apps as global_apps
    from django.contrib.auth.management import create_permissions

    for config in global_apps.get_app_configs():
        create_permissions(config, verbosity=0, apps=apps, using=schema_editor.connection.alias)
    roles_install(apps.get_model("auth", "Group"), apps.get_model("auth", "Permission"))


def revoke(apps, schema_editor):
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    outbox = Permission.objects.filter(content_type__app_label="events")
    for group in Group.objects.filter(name__in=ROLES):
        group.permissions.remove(*outbox)


class Migration(migrations.Migration):
    dependencies = [
        ("handoffs", "0002_decision_batches"),
        ("events", "0001_outbox"),
    ]

    operations = [migrations.RunPython(grant, revoke)]
