"""PostgreSQL: ``recovery_tail_observe_record`` parses the run's written tail once.

Migration 0018's function cast ``p_checkpoints`` to ``jsonb`` twice: once to compare the
stored checkpoints past the mark with it, once to take the head from its last element. The
tail is the two checkpoints the run wrote at its previous step, facts included (about a
kilobyte of JSON, every quote of the facts escaped), and parsing it was a tenth of the
server's JSON parsing per chained step (``bench/instructions.py``). Now it is parsed once,
into ``v_tail``; what the function checks, writes and answers is unchanged.
"""

import importlib

from django.db import migrations

_previous = importlib.import_module("recovery.migrations.0018_tail_observe_record")

FUNCTION = _previous.FUNCTION.replace(
    "    v_links jsonb := p_links::jsonb;\n",
    "    v_links jsonb := p_links::jsonb;\n    v_tail jsonb := p_checkpoints::jsonb;\n",
).replace(
    "            = p_checkpoints::jsonb\n", "            = v_tail\n"
).replace(
    "    v_head := p_checkpoints::jsonb -> -1;\n", "    v_head := v_tail -> -1;\n"
)
assert FUNCTION.count("p_checkpoints::jsonb") == 1, "migration 0018's function text changed"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_previous.FUNCTION)


class Migration(migrations.Migration):
    dependencies = [("recovery", "0019_hot_counters_without_check")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
