"""PostgreSQL: a chained step's call does not check the lease its caller's rows checked.

``recovery_tail_observe_record`` (migration 0026) moves step k's operation on the condition
that the run's lease is live, looked up and share-locked by a sub-select of its own. A
chained step's call never comes alone: the engine's step rows go in front of it in the
same statement (ADR 0047, 0073), each fenced on the same lease, and the call runs only if
they matched — so the lease was found live and its row is share-locked until the commit
by then. The second look-up cost a sub-plan set up at every execution (an index scan and
a row lock), and its execution.

``p_lease_checked`` (the last argument) says the caller's rows in front checked it: the
move is then made without the look-up. No takeover can come between: it would update the
lease row, which the caller's look-up holds until the commit (ADR 0068's argument for the
record's insert). Without it, everything is as before. The 18-argument function of
migration 0026 stays beside it, for a worker of the previous release.
"""

import importlib

from django.db import migrations

_JOINED = importlib.import_module("recovery.migrations.0026_tail_joined_not_framed")

NEW_SIGNATURE = (
    "recovery_tail_observe_record(text, text, bigint, text, text, text, text, text, bigint, "
    "text, text, text[], text, text, text, text, text, text, boolean)"
)

_LOOKUP = """    AND EXISTS (
        SELECT 1 FROM recovery_lease WHERE key = p_lease_key AND holder = p_holder
        AND fence = p_fence AND expires_at > clock_timestamp() FOR SHARE
    )
"""


def _checked_once(function: str) -> str:
    head = "p_key_id text, p_links text, p_observed_fact text, p_recorded_fact text\n) RE"
    assert function.count(head) == 1, "the function's parameters changed"
    function = function.replace(head, head.replace("\n) RE", ", p_lease_checked boolean\n) RE"))
    start = function.index("    UPDATE recovery_operation SET state = v_op ->> 3,")
    end = function.index("    IF NOT FOUND THEN", start)
    update = function[start:end]
    assert update.count(_LOOKUP) == 1, "the move's lease look-up changed"
    branches = (
        "    IF p_lease_checked THEN  -- by the caller's rows in front, share-locked\n"
        f"{_indented(update.replace(_LOOKUP, ''))}\n    ELSE\n{_indented(update)}\n    END IF;\n"
    )
    return function[:start] + branches + function[end:]


def _indented(text: str) -> str:
    return "\n".join(f"    {line}" if line else line for line in text.splitlines())


FUNCTION = _checked_once(_JOINED.TAIL)


def create(apps, schema_editor):
    """The 19-argument function beside the 18-argument one, which stays for a worker of
    the previous release until it is restarted."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {NEW_SIGNATURE}")


class Migration(migrations.Migration):
    dependencies = [("recovery", "0027_tail_observe")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
