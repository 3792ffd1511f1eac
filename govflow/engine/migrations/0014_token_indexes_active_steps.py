"""The token table's indexes hold what the engine looks up, and no more (ADR 0046).

The single-column index on ``instance_id`` goes: the unique (instance_id, ordinal)
constraint's index serves every look-up by instance, and the cascade, with its prefix.
(A first version of this migration also narrowed ``engine_token_due`` to the active steps;
that part was withdrawn before any release, see ADR 0046, "Withdrawn": the index stays
whole.)

On PostgreSQL the index is dropped with ``DROP INDEX CONCURRENTLY``: the table is never
locked against the workers' writes, so a deployment with a large table keeps running
steps (the migration is therefore not atomic). Other databases (SQLite) run Django's own
operations. Reversing uses Django's own operations everywhere.

The operation below is copied in recovery's migration 0015: a migration keeps the code
it ran (it never imports code that may change later).
"""

from django.db import migrations, models, transaction
from django.db.migrations.operations.base import Operation


class OnlineOnPostgreSQL(Operation):
    """``operation`` as Django runs it, except forwards on PostgreSQL: there ``online``
    (called with the schema editor and the model) makes the same change in statements
    that take no long lock on the table."""

    reversible = True
    reduces_to_sql = True

    def __init__(self, operation, online):
        self.operation = operation
        self.online = online

    def state_forwards(self, app_label, state):
        self.operation.state_forwards(app_label, state)

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            # The migration is not atomic (for PostgreSQL's CONCURRENTLY): each of Django's
            # own operations is (SQLite rebuilds the table for some).
            with transaction.atomic(using=schema_editor.connection.alias):
                self.operation.database_forwards(app_label, schema_editor, from_state, to_state)
            return
        if schema_editor.connection.in_atomic_block:
            raise RuntimeError("run this migration with atomic = False (CONCURRENTLY)")
        model = to_state.apps.get_model(app_label, self.operation.model_name)
        self.online(schema_editor, model)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        with transaction.atomic(using=schema_editor.connection.alias):
            self.operation.database_backwards(app_label, schema_editor, from_state, to_state)

    def describe(self):
        return f"{self.operation.describe()} (on PostgreSQL without a long lock)"

    def references_model(self, name, app_label):
        return self.operation.references_model(name, app_label)


def drop(name):
    def online(editor, model):
        editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {editor.quote_name(name)}")

    return online


def drop_single_column_indexes(column):
    """Drop the plain (not unique) indexes on ``column`` alone, whatever their names."""

    def online(editor, model):
        with editor.connection.cursor() as cursor:
            found = editor.connection.introspection.get_constraints(cursor, model._meta.db_table)
        for name, info in sorted(found.items()):
            plain = info["index"] and not info["unique"] and not info["primary_key"]
            if plain and info["columns"] == [column]:
                drop(name)(editor, model)

    return online


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("engine", "0013_linked_run"),
    ]

    operations = [
        OnlineOnPostgreSQL(
            migrations.AlterField(
                model_name="token",
                name="instance",
                field=models.ForeignKey(
                    db_index=False,
                    on_delete=models.deletion.CASCADE,
                    related_name="tokens",
                    to="engine.instance",
                ),
            ),
            drop_single_column_indexes("instance_id"),
        ),
    ]
