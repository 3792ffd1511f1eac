"""The desk's roles as groups with their permissions (``govflow.handoffs.roles``, ADR 0018).

Permissions are created after migrations (post_migrate), so this migration creates the ones
it grants first. Re-running it (or a later version of this mapping) sets each role's
permissions to exactly the mapping; tenant groups (``tenant:<name>``) are not touched.
"""

from django.db import migrations

from govflow.handoffs.roles import ROLES, roles_install

def create_roles(apps, schema_editor):
    from django.apps import apps as global_apps
    from django.contrib.auth.management import create_permissions

    for config in global_apps.get_app_configs():
        create_permissions(config, verbosity=0, apps=apps, using=schema_editor.connection.alias)
    # The outbox's permissions (govflow.events) are granted by 0003_webhook_roles, which
    # runs after the outbox's own migration.
    roles_install(
        apps.get_model("auth", "Group"),
        apps.get_model("auth", "Permission"),
        skip_apps=frozenset({"events"}),
    )


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
