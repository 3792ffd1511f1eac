"""PostgreSQL: a standalone success compares the run's tail as framed text too.

``recovery_lone_success`` (migration 0016, ADR 0040) checks, as
``recovery_tail_observe_record`` does, that the stored rows past the run's mark are the ones
the run wrote. Migration 0022 made that check compare one framed text per side instead of
JSON; this makes the standalone success's check the same, with the same framing, so that
both functions take the tail the same way (``recovery.services.lone.tail_framed``). What
the function checks, writes and answers is unchanged.
"""

import importlib

from django.db import migrations

_LONE = importlib.import_module("recovery.migrations.0016_lone_call_functions")
_FRAMED = importlib.import_module("recovery.migrations.0022_tail_compared_as_framed_text")

_CHANGES = (
    (
        f"(SELECT jsonb_agg(jsonb_build_array({_LONE._CP_TEXT}) ORDER BY c.seq)",
        f"(SELECT string_agg({_FRAMED.framed(_FRAMED.CP_COLUMNS)}, '' ORDER BY c.seq)",
    ),
    ("= p_checkpoints::jsonb", "= p_checkpoints"),
    (
        f"(SELECT jsonb_agg(jsonb_build_array({_LONE._OP_TEXT})"
        ' ORDER BY o.key COLLATE "C")',
        f"(SELECT string_agg({_FRAMED.framed(_FRAMED.OP_COLUMNS)}, ''"
        ' ORDER BY o.key COLLATE "C")',
    ),
    ("= p_operations::jsonb AS ok", "= p_operations AS ok"),
)


def _framed(function: str) -> str:
    for old, new in _CHANGES:
        assert function.count(old) == 1, "migration 0016's function text changed"
        function = function.replace(old, new)
    return function


SUCCESS = _framed(_LONE.SUCCESS)


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(SUCCESS)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_LONE.SUCCESS)


class Migration(migrations.Migration):
    dependencies = [("recovery", "0022_tail_compared_as_framed_text")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
