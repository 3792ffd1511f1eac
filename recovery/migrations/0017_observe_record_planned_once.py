"""PostgreSQL: ``recovery_observe_record`` keeps one generic plan per session (ADR 0049).

The function's statements were planned the way the server chose for each call: with a
generic plan kept for the session, or anew when its estimates favoured custom plans, at
every chained step. As for the standalone functions of migration 0016, the function is
declared ``plan_cache_mode = force_generic_plan``; what it does is unchanged.
"""

from django.db import migrations


def generic(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "ALTER FUNCTION recovery_observe_record SET plan_cache_mode = force_generic_plan"
        )


def as_before(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER FUNCTION recovery_observe_record RESET plan_cache_mode")


class Migration(migrations.Migration):
    dependencies = [("recovery", "0016_lone_call_functions")]

    operations = [migrations.RunPython(generic, as_before, elidable=False)]
