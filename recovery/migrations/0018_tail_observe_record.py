"""PostgreSQL: a chained step's ledger call that checks the run's written tail (ADR 0051).

``recovery_observe_record`` (migration 0011) needs the chain's head and, for a success, the
chain verified first: the engine read the checkpoints past the run's verified mark and the
operations they touched, and verified them in Python, before the call (one more round trip
per chained step). ``recovery_tail_observe_record`` takes instead what the run itself wrote
after its mark (ADR 0040: known row for row, because this process computed it) and checks,
before anything else, that the stored rows past the mark are exactly those: the mark's
checkpoint still has its link, the checkpoints after it, aggregated in order, equal the
written ones, and the operation rows past it equal the ones the written tail left. That is
what reading and replaying them would verify (``verify_tail``). If they differ it returns
``'tail'`` and writes nothing; the caller reads and verifies as before. If they are equal it
is ``recovery_observe_record`` itself, for the operation found by its key, after the last
written checkpoint. Planned once per session (ADR 0049).

``recovery_all_written(answer)`` raises (SQLSTATE ``GF001``, the answer as its detail) when
a call's answer is not '': wrapped around a chained step's statement sent alone in
autocommit (ADR 0051), it makes a refused write abort the whole statement, the caller's
rows in front of the call included, instead of committing them without it. SQLite has no
one-call path; nothing is created there.
"""

from django.db import migrations

_CP_TEXT = (
    "c.seq::text, c.kind::text, c.fact::text, c.fact_fp::text, c.prev_link::text, "
    "c.link::text, c.key_id::text, c.projection_fp::text"
)
_OP_TEXT = (
    "o.key::text, o.state::text, o.revision::text, o.step_id::text, o.action::text, "
    "o.recovery_mode::text, o.definition_fp::text, o.input_fp::text, o.preview_fp::text, "
    "o.access_fp::text, o.idempotency_fp::text, o.result_fp::text, o.lease_key::text, "
    "o.fence::text, o.ordinal::text, o.chain_seq::text"
)

FUNCTION = f"""
CREATE OR REPLACE FUNCTION recovery_tail_observe_record(
    p_subject_type text, p_subject_id text, p_mark_seq bigint, p_mark_link text,
    p_checkpoints text, p_operations text,
    p_head_seq bigint, p_head_link text,
    p_lease_key text, p_holder text, p_fence bigint,
    p_op_key text, p_from_state text, p_from_revision integer, p_to_state text,
    p_result_fp text, p_success boolean,
    p_key text, p_step_id text, p_action text, p_mode text, p_definition_fp text,
    p_input_fp text, p_preview_fp text, p_access_fp text, p_idempotency_fp text,
    p_ordinal integer, p_state text, p_blocking text[], p_ledger_type text, p_ledger_id text,
    p_key_id text,
    p_observed_kind text, p_observed_fact text, p_observed_fact_fp text,
    p_observed_link text, p_observed_projection text,
    p_recorded_kind text, p_recorded_fact text, p_recorded_fact_fp text,
    p_recorded_link text, p_recorded_projection text
) RETURNS text LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_op_id bigint;
BEGIN
    -- The stored rows past the run's mark are the ones it wrote (the tail verification).
    IF NOT COALESCE(
        (p_mark_seq = 0 OR EXISTS (
            SELECT 1 FROM recovery_checkpoint WHERE subject_type = p_subject_type
            AND subject_id = p_subject_id AND seq = p_mark_seq AND link = p_mark_link))
        AND (SELECT jsonb_agg(jsonb_build_array({_CP_TEXT}) ORDER BY c.seq)
             FROM recovery_checkpoint c WHERE c.subject_type = p_subject_type
             AND c.subject_id = p_subject_id AND c.seq > p_mark_seq)
            = p_checkpoints::jsonb
        AND (SELECT jsonb_agg(jsonb_build_array({_OP_TEXT}) ORDER BY o.key COLLATE "C")
             FROM recovery_operation o WHERE o.subject_type = p_subject_type
             AND o.subject_id = p_subject_id AND o.chain_seq > p_mark_seq)
            = p_operations::jsonb,
        false)
    THEN
        RETURN 'tail';
    END IF;
    SELECT id INTO v_op_id FROM recovery_operation WHERE key = p_op_key;
    IF v_op_id IS NULL THEN
        RETURN 'tail';
    END IF;
    RETURN recovery_observe_record(
        p_subject_type, p_subject_id, p_head_seq, p_head_link,
        p_lease_key, p_holder, p_fence,
        v_op_id, p_from_state, p_from_revision, p_to_state, p_result_fp, p_success,
        p_key, p_step_id, p_action, p_mode, p_definition_fp,
        p_input_fp, p_preview_fp, p_access_fp, p_idempotency_fp,
        p_ordinal, p_state, p_blocking, p_ledger_type, p_ledger_id,
        p_key_id,
        p_observed_kind, p_observed_fact, p_observed_fact_fp,
        p_observed_link, p_observed_projection,
        p_recorded_kind, p_recorded_fact, p_recorded_fact_fp,
        p_recorded_link, p_recorded_projection);
END;
$$;
"""

WRITTEN = """
CREATE OR REPLACE FUNCTION recovery_all_written(p_answer text)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF p_answer <> '' THEN
        RAISE EXCEPTION USING ERRCODE = 'GF001', DETAIL = p_answer,
            MESSAGE = 'recovery: ' || p_answer || ' refused; nothing of this statement '
                || 'was written';
    END IF;
    RETURN p_answer;
END;
$$;
"""

DROP = (
    "DROP FUNCTION IF EXISTS recovery_tail_observe_record",
    "DROP FUNCTION IF EXISTS recovery_all_written",
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION)
        schema_editor.execute(WRITTEN)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in DROP:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("recovery", "0017_observe_record_planned_once")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
