"""PostgreSQL: one server call for a step's ledger writes (ADR 0031).

``recovery_observe_record`` moves step k's operation to what was observed, records step
k+1's operation, and inserts both checkpoints, in this order, in the caller's transaction
— what ``operation_observe`` followed by ``operation_record`` send as separate statements,
with the same conditions: the chain head the links were computed against, the fence (with
``FOR SHARE`` on the lease row), no open integrity incident, no unsettled operation of the
same effect. The keyed links are computed in Python and arrive as parameters: the chain
key never reaches the database.

It returns '' when everything was written, or which write matched nothing: 'head' (the
chain moved since its head was read), 'observe', 'chain' (a checkpoint's position was
taken), 'record'. It never raises for these, so the caller can still ask the database why
(the same questions ``operation_observe`` and ``operation_record`` ask) before it rolls the
transaction back. SQLite keeps the separate statements; nothing is created there.
"""

from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION recovery_observe_record(
    p_subject_type text, p_subject_id text, p_head_seq bigint, p_head_link text,
    p_lease_key text, p_holder text, p_fence bigint,
    p_op_id bigint, p_from_state text, p_from_revision integer, p_to_state text,
    p_result_fp text, p_success boolean,
    p_key text, p_step_id text, p_action text, p_mode text, p_definition_fp text,
    p_input_fp text, p_preview_fp text, p_access_fp text, p_idempotency_fp text,
    p_ordinal integer, p_state text, p_blocking text[], p_ledger_type text, p_ledger_id text,
    p_key_id text,
    p_observed_kind text, p_observed_fact text, p_observed_fact_fp text,
    p_observed_link text, p_observed_projection text,
    p_recorded_kind text, p_recorded_fact text, p_recorded_fact_fp text,
    p_recorded_link text, p_recorded_projection text
) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    -- 1. The chain still ends where the links were computed (ADR 0002: the unique
    --    (subject, seq) constraint below is the compare-and-swap; this also refuses a
    --    head that was replaced in place).
    IF p_head_seq > 0 AND NOT EXISTS (
        SELECT 1 FROM recovery_checkpoint WHERE subject_type = p_subject_type
        AND subject_id = p_subject_id AND seq = p_head_seq AND link = p_head_link
    ) THEN
        RETURN 'head';
    END IF;
    -- 2. Step k observed: compare-and-swap on state and revision, the fence inside the
    --    write (ADR 0003), no open incident for a success.
    UPDATE recovery_operation SET state = p_to_state, revision = p_from_revision + 1,
        result_fp = p_result_fp, chain_seq = p_head_seq + 1, updated_at = clock_timestamp()
    WHERE id = p_op_id AND state = p_from_state AND revision = p_from_revision
    AND EXISTS (
        SELECT 1 FROM recovery_lease WHERE key = p_lease_key AND holder = p_holder
        AND fence = p_fence AND expires_at > clock_timestamp() FOR SHARE
    )
    AND (NOT p_success OR NOT EXISTS (
        SELECT 1 FROM recovery_incident WHERE subject_type = p_subject_type
        AND subject_id = p_subject_id AND status = 'open'
    ));
    IF NOT FOUND THEN
        RETURN 'observe';
    END IF;
    INSERT INTO recovery_checkpoint (subject_type, subject_id, seq, kind, fact, fact_fp,
        prev_link, link, key_id, projection_fp, recorded_at)
    VALUES (p_subject_type, p_subject_id, p_head_seq + 1, p_observed_kind, p_observed_fact,
        p_observed_fact_fp, p_head_link, p_observed_link, p_key_id, p_observed_projection,
        clock_timestamp())
    ON CONFLICT (subject_type, subject_id, seq) DO NOTHING;
    IF NOT FOUND THEN
        RETURN 'chain';
    END IF;
    -- 3. Step k+1 recorded: the dispatch write with its checks (ADR 0009).
    INSERT INTO recovery_operation (key, subject_type, subject_id, step_id, action,
        recovery_mode, definition_fp, input_fp, preview_fp, access_fp, idempotency_fp,
        result_fp, lease_key, fence, ordinal, state, revision, chain_seq, recorded_at,
        updated_at)
    SELECT p_key, p_subject_type, p_subject_id, p_step_id, p_action, p_mode,
        p_definition_fp, p_input_fp, p_preview_fp, p_access_fp, p_idempotency_fp, '',
        p_lease_key, p_fence, p_ordinal, p_state, 1, p_head_seq + 2, clock_timestamp(),
        clock_timestamp()
    WHERE EXISTS (
        SELECT 1 FROM recovery_lease WHERE key = p_lease_key AND holder = p_holder
        AND fence = p_fence AND expires_at > clock_timestamp() FOR SHARE
    )
    AND NOT EXISTS (
        SELECT 1 FROM recovery_incident WHERE status = 'open' AND (
            (subject_type = p_subject_type AND subject_id = p_subject_id)
            OR (subject_type = p_ledger_type AND subject_id = p_ledger_id))
    )
    AND NOT EXISTS (
        SELECT 1 FROM recovery_operation WHERE idempotency_fp = p_idempotency_fp
        AND state = ANY(p_blocking)
    )
    ON CONFLICT (key) DO NOTHING;
    IF NOT FOUND THEN
        RETURN 'record';
    END IF;
    INSERT INTO recovery_checkpoint (subject_type, subject_id, seq, kind, fact, fact_fp,
        prev_link, link, key_id, projection_fp, recorded_at)
    VALUES (p_subject_type, p_subject_id, p_head_seq + 2, p_recorded_kind, p_recorded_fact,
        p_recorded_fact_fp, p_observed_link, p_recorded_link, p_key_id,
        p_recorded_projection, clock_timestamp())
    ON CONFLICT (subject_type, subject_id, seq) DO NOTHING;
    IF NOT FOUND THEN
        RETURN 'chain';
    END IF;
    RETURN '';
END;
$$;
"""

DROP = "DROP FUNCTION IF EXISTS recovery_observe_record"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("recovery", "0010_compensation")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
