"""The ledger's operation table keeps the indexes its queries use, and no more (ADR 0046).

- ``recovery_op_state`` (state) over every operation becomes ``recovery_op_unsettled``,
  the same column over the states an operation leaves again (prepared, dispatched,
  outcome unknown): a settled operation's row version writes no entry into it.
- ``key`` loses ``unique=True`` for a ``UniqueConstraint`` (``recovery_operation_key``):
  the same uniqueness, without the ``varchar_pattern_ops`` index (``…_like``) PostgreSQL
  got for a unique CharField, which serves only a case-sensitive prefix ``LIKE`` that
  nothing asks of an operation key.

On PostgreSQL nothing locks the table against the workers' writes for longer than a
catalogue change: the new indexes are built with ``CREATE INDEX CONCURRENTLY`` (the unique
one then becomes the constraint with ``ADD CONSTRAINT … UNIQUE USING INDEX``) before the
old ones are dropped (``DROP INDEX CONCURRENTLY``; the old unique constraint with a short
``ALTER TABLE … DROP CONSTRAINT``), so ``ON CONFLICT (key)`` always has a unique index
to infer. The migration is therefore not atomic; an interrupted build leaves an invalid
index, which running ``migrate`` again drops and rebuilds. Other databases (SQLite) run
Django's own operations. Reversing uses Django's own operations everywhere.

The operation below is a copy of the engine's migration 0014: a migration keeps the code
it ran (it never imports code that may change later).
"""

from django.db import migrations, models, transaction
from django.db.migrations.operations.base import Operation
from django.db.models import Q


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


def _valid(editor, name):
    """Whether index ``name`` exists and is valid (None: it does not exist, or sqlmigrate)."""
    if editor.collect_sql:
        return None
    with editor.connection.cursor() as cursor:
        cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        row = cursor.fetchone()
    return None if row is None else row[0]


def build(index):
    def online(editor, model):
        valid = _valid(editor, index.name)
        if valid:
            return  # built by an earlier run that stopped after it
        if valid is False:  # left invalid by an interrupted CREATE INDEX CONCURRENTLY
            editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {editor.quote_name(index.name)}")
        editor.add_index(model, index, concurrently=True)

    return online


def drop(name):
    def online(editor, model):
        editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {editor.quote_name(name)}")

    return online


def unique_constraint(name, column):
    """Build the constraint's unique index concurrently, then make it the constraint."""

    def online(editor, model):
        table = editor.quote_name(model._meta.db_table)
        valid = _valid(editor, name)
        if valid is False:  # left invalid by an interrupted CREATE INDEX CONCURRENTLY
            editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {editor.quote_name(name)}")
        if not valid:
            column_sql = editor.quote_name(model._meta.get_field(column).column)
            editor.execute(
                f"CREATE UNIQUE INDEX CONCURRENTLY {editor.quote_name(name)} ON {table} "
                f"({column_sql})"
            )
        if editor.collect_sql or not _is_constraint(editor, model._meta.db_table, name):
            editor.execute(
                f"ALTER TABLE {table} ADD CONSTRAINT {editor.quote_name(name)} "
                f"UNIQUE USING INDEX {editor.quote_name(name)}"
            )

    return online


def _is_constraint(editor, table, name):
    with editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_constraint WHERE conrelid = to_regclass(%s) AND conname = %s",
            [table, name],
        )
        return cursor.fetchone() is not None


def drop_field_unique(column, keep):
    """Drop what ``unique=True`` made on ``column``: its unique constraint (not ``keep``)
    and its ``varchar_pattern_ops`` index (``…_like``), whatever their names."""

    def online(editor, model):
        table = model._meta.db_table
        with editor.connection.cursor() as cursor:
            found = editor.connection.introspection.get_constraints(cursor, table)
        for name, info in sorted(found.items()):
            if info["columns"] != [column] or name == keep or info["primary_key"]:
                continue
            if info["unique"]:
                editor.execute(
                    f"ALTER TABLE {editor.quote_name(table)} "
                    f"DROP CONSTRAINT {editor.quote_name(name)}"
                )
            elif info["index"] and name.endswith("_like"):
                drop(name)(editor, model)

    return online


UNSETTLED = models.Index(
    condition=Q(state__in=["dispatched", "outcome_unknown", "prepared"]),
    fields=["state"],
    name="recovery_op_unsettled",
)
KEY = "recovery_operation_key"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("recovery", "0014_chain_audit"),
    ]

    operations = [
        OnlineOnPostgreSQL(
            migrations.AddIndex(model_name="operation", index=UNSETTLED), build(UNSETTLED)
        ),
        OnlineOnPostgreSQL(
            migrations.RemoveIndex(model_name="operation", name="recovery_op_state"),
            drop("recovery_op_state"),
        ),
        OnlineOnPostgreSQL(
            migrations.AddConstraint(
                model_name="operation",
                constraint=models.UniqueConstraint(fields=("key",), name=KEY),
            ),
            unique_constraint(KEY, "key"),
        ),
        OnlineOnPostgreSQL(
            migrations.AlterField(
                model_name="operation", name="key", field=models.CharField(max_length=80)
            ),
            drop_field_unique("key", keep=KEY),
        ),
    ]
