"""PostgreSQL: a chained step's two new facts travel as plain texts, not inside JSON.

``recovery_tail_observe_record`` (migrations 0018, 0020) took the two checkpoints it
writes — kinds, facts, fingerprints, links, projections — as one JSON array of texts. A
fact is JSON itself, so every quote of it was escaped by the client's encoder and
unescaped again, character by character, by the server's parser: the facts were over a
third of the JSON a chained step's statement carried. Now ``p_links`` keeps the kinds,
fingerprints, links and projections, and the facts are ``p_observed_fact`` and
``p_recorded_fact``. With the engine's step rows in front of it the statement has 47
parameters, under the 50 whose conversion psycopg caches. ``bench/instructions.py``: the
server's instructions per step 2,594,000 -> 2,554,000 (JSON parsing 212,000 -> 173,000),
the client's 4,587,000 -> 4,557,000. What the function checks, writes and answers is
unchanged.
"""

import importlib

from django.db import migrations

_PREVIOUS = importlib.import_module("recovery.migrations.0020_tail_parsed_once")

_CHANGES = (
    ("CREATE OR REPLACE FUNCTION", "CREATE FUNCTION"),  # a new signature, the old dropped
    (
        "    p_key_id text, p_links text\n",
        "    p_key_id text, p_links text, p_observed_fact text, p_recorded_fact text\n",
    ),
    (
        "        v_links ->> 0, v_links ->> 1, v_links ->> 2, v_links ->> 3, v_links ->> 4,\n"
        "        v_links ->> 5, v_links ->> 6, v_links ->> 7, v_links ->> 8, v_links ->> 9);\n",
        "        v_links ->> 0, p_observed_fact, v_links ->> 1, v_links ->> 2, v_links ->> 3,\n"
        "        v_links ->> 4, p_recorded_fact, v_links ->> 5, v_links ->> 6, v_links ->> 7);\n",
    ),
)


def _with_facts_as_texts(function: str) -> str:
    for old, new in _CHANGES:
        assert function.count(old) == 1, "migration 0020's function text changed"
        function = function.replace(old, new)
    return function


FUNCTION = _with_facts_as_texts(_PREVIOUS.FUNCTION)

_OLD_SIGNATURE = (
    "recovery_tail_observe_record(text, text, bigint, text, text, text, text, text, bigint, "
    "text, text, text[], text, text, text, text)"
)
_NEW_SIGNATURE = _OLD_SIGNATURE.removesuffix(")") + ", text, text)"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {_OLD_SIGNATURE}")
        schema_editor.execute(FUNCTION)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {_NEW_SIGNATURE}")
        schema_editor.execute(_PREVIOUS.FUNCTION)


class Migration(migrations.Migration):
    dependencies = [("recovery", "0020_tail_parsed_once")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
