"""PostgreSQL: a chained step's tail is compared as one framed text, not as JSON.

``recovery_tail_observe_record`` (migrations 0018, 0020, 0021) checks that the stored rows
past the run's mark are exactly the ones the run wrote (ADR 0051). It built a JSON array
of each row's columns as texts (``jsonb_agg`` of ``jsonb_build_array``) and compared it
with two JSON parameters that the server parsed first, facts and all: the checkpoints'
canonical facts travelled as JSON strings inside JSON. Now each side frames the same texts
the same way — every column as ``<length>:<text>`` (``concat(length(x), ':', x)``; a NULL,
which the run never writes, is ``:`` alone), rows in the same order, concatenated — and
compares the two texts. The framing is unambiguous (each field's length comes first, each
row has its fixed columns), so two texts are equal exactly when every column of every row
is: the same comparison, without building or parsing JSON. The head the links were
computed from (the last checkpoint the run wrote) travels in ``p_op`` (its seventh and
eighth elements) instead of being read out of the checkpoints' JSON.
``recovery_lone_success`` (migration 0016) keeps its JSON comparison.
"""

import importlib

from django.db import migrations

_PREVIOUS = importlib.import_module("recovery.migrations.0021_tail_facts_as_texts")

CP_COLUMNS = (
    "c.seq::text",
    "c.kind::text",
    "c.fact::text",
    "c.fact_fp::text",
    "c.prev_link::text",
    "c.link::text",
    "c.key_id::text",
    "c.projection_fp::text",
)
OP_COLUMNS = (
    "o.key::text",
    "o.state::text",
    "o.revision::text",
    "o.step_id::text",
    "o.action::text",
    "o.recovery_mode::text",
    "o.definition_fp::text",
    "o.input_fp::text",
    "o.preview_fp::text",
    "o.access_fp::text",
    "o.idempotency_fp::text",
    "o.result_fp::text",
    "o.lease_key::text",
    "o.fence::text",
    "o.ordinal::text",
    "o.chain_seq::text",
)
"""The columns compared, in the order of ``recovery.services.lone.tail_framed``'s rows."""


def framed(columns) -> str:
    """SQL framing one row: ``<length>:<text>`` per column (``lone.framed_rows``)."""
    return "concat(" + ", ".join(f"length({c}), ':', {c}" for c in columns) + ")"


FUNCTION = f"""
CREATE OR REPLACE FUNCTION recovery_tail_observe_record(
    p_subject_type text, p_subject_id text, p_mark_seq bigint, p_mark_link text,
    p_checkpoints text, p_operations text,
    p_lease_key text, p_holder text, p_fence bigint,
    p_op text, p_next text, p_blocking text[], p_ledger_type text, p_ledger_id text,
    p_key_id text, p_links text, p_observed_fact text, p_recorded_fact text
) RETURNS text LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_op_id bigint;
    v_op jsonb := p_op::jsonb;
    v_next jsonb := p_next::jsonb;
    v_links jsonb := p_links::jsonb;
BEGIN
    -- The stored rows past the run's mark are the ones it wrote (the tail verification),
    -- each side framed the same way (migration 0022).
    IF NOT COALESCE(
        (p_mark_seq = 0 OR EXISTS (
            SELECT 1 FROM recovery_checkpoint WHERE subject_type = p_subject_type
            AND subject_id = p_subject_id AND seq = p_mark_seq AND link = p_mark_link))
        AND (SELECT string_agg({framed(CP_COLUMNS)}, '' ORDER BY c.seq)
             FROM recovery_checkpoint c WHERE c.subject_type = p_subject_type
             AND c.subject_id = p_subject_id AND c.seq > p_mark_seq)
            = p_checkpoints
        AND (SELECT string_agg({framed(OP_COLUMNS)}, '' ORDER BY o.key COLLATE "C")
             FROM recovery_operation o WHERE o.subject_type = p_subject_type
             AND o.subject_id = p_subject_id AND o.chain_seq > p_mark_seq)
            = p_operations,
        false)
    THEN
        RETURN 'tail';
    END IF;
    SELECT id INTO v_op_id FROM recovery_operation WHERE key = v_op ->> 0;
    IF v_op_id IS NULL THEN
        RETURN 'tail';
    END IF;
    -- The head is the last checkpoint the run wrote (p_op's seventh and eighth elements).
    RETURN recovery_observe_record(
        p_subject_type, p_subject_id, (v_op ->> 6)::bigint, v_op ->> 7,
        p_lease_key, p_holder, p_fence,
        v_op_id, v_op ->> 1, (v_op ->> 2)::integer, v_op ->> 3, v_op ->> 4,
        (v_op ->> 5)::boolean,
        v_next ->> 0, v_next ->> 1, v_next ->> 2, v_next ->> 3, v_next ->> 4,
        v_next ->> 5, v_next ->> 6, v_next ->> 7, v_next ->> 8,
        (v_next ->> 9)::integer, v_next ->> 10, p_blocking, p_ledger_type, p_ledger_id,
        p_key_id,
        v_links ->> 0, p_observed_fact, v_links ->> 1, v_links ->> 2, v_links ->> 3,
        v_links ->> 4, p_recorded_fact, v_links ->> 5, v_links ->> 6, v_links ->> 7);
END;
$$;
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            _PREVIOUS.FUNCTION.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
        )


class Migration(migrations.Migration):
    dependencies = [("recovery", "0021_tail_facts_as_texts")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
