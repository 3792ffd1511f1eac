"""PostgreSQL: a run's tail is compared as its fields joined, not framed field by field.

``recovery_tail_observe_record`` (migration 0025) and ``recovery_lone_success`` (migration
0023) check that the stored rows past a run's mark are the ones the run wrote by comparing
one text per side (migration 0022): every column of every row framed as
``<length>:<text>``, built by one ``concat`` of three arguments per column, a ``length``
call and a cast to text for each (``concat(length(c.seq::text), ':', c.seq::text, …)``,
24 columns). PostgreSQL sets each of those expressions up again at every execution: a
function look-up per call, a type look-up per cast, a step per argument
(``bench/instructions.py``: building projections and looking functions up were a
tenth of the server's instructions per step).

Now each row is its columns joined by the unit separator (U+001F) by one
``concat_ws(E'\\x1f', c.seq, c.kind, …)``, rows joined by the record separator (U+001E)
in ``string_agg``. The comparison stays exact: the caller joins the texts it wrote the same
way only when none of them holds either separator (``recovery.services.lone.joined_rows``;
else it reads and verifies the tail instead), so its text has exactly so many separators,
and a stored text equal to it has as many: no stored field can hold one, every field has
the caller's boundaries, and every field is equal. A NULL, which the run never writes, is
left out by ``concat_ws``: a row short of a field, never equal. Everything else the two
functions check, write and answer is unchanged.
"""

import importlib

from django.db import migrations

_FRAMED = importlib.import_module("recovery.migrations.0022_tail_compared_as_framed_text")
_SUCCESS = importlib.import_module("recovery.migrations.0023_lone_success_tail_framed")
_INLINED = importlib.import_module("recovery.migrations.0025_tail_call_inlined")


def joined(columns) -> str:
    """SQL joining one row's columns with the unit separator (``lone.joined_rows``);
    ``concat_ws`` writes each column as its type's text, as the casts wrote it."""
    return "concat_ws(E'\\x1f', " + ", ".join(c.removesuffix("::text") for c in columns) + ")"


def _joined(function: str) -> str:
    for columns in (_FRAMED.CP_COLUMNS, _FRAMED.OP_COLUMNS):
        old = f"string_agg({_FRAMED.framed(columns)}, ''"
        assert function.count(old) == 1, "the framed comparison's text changed"
        function = function.replace(old, f"string_agg({joined(columns)}, E'\\x1e'")
    return function


TAIL = _joined(_INLINED.FUNCTION)
SUCCESS = _joined(_SUCCESS.SUCCESS)


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(TAIL)
        schema_editor.execute(SUCCESS)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_INLINED.FUNCTION)
        schema_editor.execute(_SUCCESS.SUCCESS)


class Migration(migrations.Migration):
    dependencies = [("recovery", "0025_tail_call_inlined")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
