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
written checkpoint. Planned once per session (ADR 0049). Its values travel packed — step
k's operation and move (``p_op``), step k+1's operation (``p_next``), both checkpoints
(``p_links``) each as one JSON array of texts, the head taken from the written tail — so
that with the caller's rows in front of it a statement has at most 50 parameters, the most
psycopg caches the conversion of (each conversion of a longer one parses the SQL again).
JSON, not ``text[]``: psycopg dumps a text array element by element, escaping every quote
of the facts with a regular expression; a JSON text is passed through as it is.

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
    p_lease_key text, p_holder text, p_fence bigint,
    p_op text, p_next text, p_blocking text[], p_ledger_type text, p_ledger_id text,
    p_key_id text, p_links text
) RETURNS text LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_op_id bigint;
    v_head jsonb;
    v_op jsonb := p_op::jsonb;
    v_next jsonb := p_next::jsonb;
    v_links jsonb := p_links::jsonb;
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
    SELECT id INTO v_op_id FROM recovery_operation WHERE key = v_op ->> 0;
    IF v_op_id IS NULL THEN
        RETURN 'tail';
    END IF;
    -- The head is the last checkpoint the run wrote (the tail's last element).
    v_head := p_checkpoints::jsonb -> -1;
    RETURN recovery_observe_record(
        p_subject_type, p_subject_id, (v_head ->> 0)::bigint, v_head ->> 5,
        p_lease_key, p_holder, p_fence,
        v_op_id, v_op ->> 1, (v_op ->> 2)::integer, v_op ->> 3, v_op ->> 4,
        (v_op ->> 5)::boolean,
        v_next ->> 0, v_next ->> 1, v_next ->> 2, v_next ->> 3, v_next ->> 4,
        v_next ->> 5, v_next ->> 6, v_next ->> 7, v_next ->> 8,
        (v_next ->> 9)::integer, v_next ->> 10, p_blocking, p_ledger_type, p_ledger_id,
        p_key_id,
        v_links ->> 0, v_links ->> 1, v_links ->> 2, v_links ->> 3, v_links ->> 4,
        v_links ->> 5, v_links ->> 6, v_links ->> 7, v_links ->> 8, v_links ->> 9);
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
