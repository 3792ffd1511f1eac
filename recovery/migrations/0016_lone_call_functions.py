"""PostgreSQL: a standalone ledger call's statement as a function planned once (ADR 0049).

ADR 0040 sends a standalone dispatch write and a standalone success each as one statement
in autocommit (``recovery/services/lone.py``). Sent from Python, each is a prepared
statement whose plan the server chooses at every execution: a *custom* plan, made anew for
the parameter values, or the *generic* plan kept for the session. Which one depends on
costs estimated from the statistics of the moment; on some servers it chose custom plans
for every execution, and planning these statements (a dozen subqueries each) doubled the
server's CPU per lifecycle (``bench/ledger.py``: 1,850 against 880 µs).

Here each statement is the body of a PL/pgSQL function with ``plan_cache_mode =
force_generic_plan``: the function's one statement is planned once per session, and the
caller's ``SELECT recovery_lone_…(…)`` is a call with nothing to plan. The statements are
the ones ADR 0040 describes, unchanged — same conditions, one snapshot, one implicit
transaction — with the parameters named:

* ``recovery_lone_record``: the operation inserted only if the chain still ends at the
  run's known head (``p_fresh``: and the subject has no checkpoint and no operation yet),
  under a live fence (``FOR SHARE`` on the lease row), with no open incident on the subject
  or the ledger and no unsettled operation of the same effect; then its checkpoint.
* ``recovery_lone_success``: the compare-and-swap to the observed state and its checkpoint,
  only if the mark's checkpoint still has its link and the checkpoints and operation rows
  past the mark, aggregated in order, equal what the run wrote (``p_checkpoints`` and
  ``p_operations``, JSON arrays of texts), under a live fence, with no open incident.

Both return true when they wrote, false when a condition matched nothing. A checkpoint that
loses the (subject, seq) compare-and-swap raises the unique violation, which aborts the
whole statement (operation row included), as before. SQLite has no standalone one-call path;
nothing is created there.
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


def _tail(written: str) -> str:
    """The checkpoint, inserted only if ``written`` (the operation's CTE) wrote its row,
    and the function's answer: whether both were written."""
    return f"""    cp AS (
        INSERT INTO recovery_checkpoint (subject_type, subject_id, seq, kind, fact, fact_fp,
            prev_link, link, key_id, projection_fp, recorded_at)
        SELECT p_subject_type, p_subject_id, p_seq, p_kind, p_fact, p_fact_fp, p_prev_link,
            p_link, p_key_id, p_projection_fp, clock_timestamp()
        WHERE EXISTS (SELECT 1 FROM {written})
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM {written}) AND EXISTS (SELECT 1 FROM cp) INTO v_wrote;
    RETURN v_wrote;
END;
$$;
"""


RECORD = f"""
CREATE OR REPLACE FUNCTION recovery_lone_record(
    p_subject_type text, p_subject_id text, p_head_seq bigint, p_head_link text,
    p_fresh boolean,
    p_key text, p_step_id text, p_action text, p_mode text, p_definition_fp text,
    p_input_fp text, p_preview_fp text, p_access_fp text, p_idempotency_fp text,
    p_lease_key text, p_holder text, p_fence bigint, p_ordinal integer, p_state text,
    p_ledger_type text, p_ledger_id text, p_blocking text[],
    p_seq bigint, p_kind text, p_fact text, p_fact_fp text, p_prev_link text, p_link text,
    p_key_id text, p_projection_fp text
) RETURNS boolean LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_wrote boolean;
BEGIN
    WITH ok AS (
        SELECT (p_head_seq = 0 OR EXISTS (
                    SELECT 1 FROM recovery_checkpoint WHERE subject_type = p_subject_type
                    AND subject_id = p_subject_id AND seq = p_head_seq
                    AND link = p_head_link))
            AND NOT EXISTS (
                    SELECT 1 FROM recovery_checkpoint WHERE subject_type = p_subject_type
                    AND subject_id = p_subject_id AND seq > p_head_seq)
            AND (NOT p_fresh OR NOT EXISTS (
                    SELECT 1 FROM recovery_operation WHERE subject_type = p_subject_type
                    AND subject_id = p_subject_id)) AS ok
    ),
    op AS (
        INSERT INTO recovery_operation (key, subject_type, subject_id, step_id, action,
            recovery_mode, definition_fp, input_fp, preview_fp, access_fp, idempotency_fp,
            result_fp, lease_key, fence, ordinal, state, revision, chain_seq, recorded_at,
            updated_at)
        SELECT p_key, p_subject_type, p_subject_id, p_step_id, p_action, p_mode,
            p_definition_fp, p_input_fp, p_preview_fp, p_access_fp, p_idempotency_fp, '',
            p_lease_key, p_fence, p_ordinal, p_state, 1, p_seq, clock_timestamp(),
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
        AND (SELECT ok FROM ok)
        ON CONFLICT (key) DO NOTHING
        RETURNING 1
    ),
{_tail("op")}"""

SUCCESS = f"""
CREATE OR REPLACE FUNCTION recovery_lone_success(
    p_subject_type text, p_subject_id text, p_mark_seq bigint, p_mark_link text,
    p_checkpoints text, p_operations text,
    p_key text, p_from_state text, p_from_revision integer, p_state text,
    p_revision integer, p_result_fp text,
    p_lease_key text, p_holder text, p_fence bigint,
    p_seq bigint, p_kind text, p_fact text, p_fact_fp text, p_prev_link text, p_link text,
    p_key_id text, p_projection_fp text
) RETURNS boolean LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_wrote boolean;
BEGIN
    WITH ok AS (
        SELECT (p_mark_seq = 0 OR EXISTS (
                    SELECT 1 FROM recovery_checkpoint WHERE subject_type = p_subject_type
                    AND subject_id = p_subject_id AND seq = p_mark_seq
                    AND link = p_mark_link))
            AND (SELECT jsonb_agg(jsonb_build_array({_CP_TEXT}) ORDER BY c.seq)
                 FROM recovery_checkpoint c WHERE c.subject_type = p_subject_type
                 AND c.subject_id = p_subject_id AND c.seq > p_mark_seq)
                = p_checkpoints::jsonb
            AND (SELECT jsonb_agg(jsonb_build_array({_OP_TEXT}) ORDER BY o.key COLLATE "C")
                 FROM recovery_operation o WHERE o.subject_type = p_subject_type
                 AND o.subject_id = p_subject_id AND o.chain_seq > p_mark_seq)
                = p_operations::jsonb AS ok
    ),
    up AS (
        UPDATE recovery_operation SET state = p_state, revision = p_revision,
            result_fp = p_result_fp, chain_seq = p_seq, updated_at = clock_timestamp()
        WHERE key = p_key AND state = p_from_state AND revision = p_from_revision
        AND EXISTS (
            SELECT 1 FROM recovery_lease WHERE key = p_lease_key AND holder = p_holder
            AND fence = p_fence AND expires_at > clock_timestamp() FOR SHARE
        )
        AND NOT EXISTS (
            SELECT 1 FROM recovery_incident WHERE subject_type = p_subject_type
            AND subject_id = p_subject_id AND status = 'open'
        )
        AND (SELECT ok FROM ok)
        RETURNING 1
    ),
{_tail("up")}"""

DROP = (
    "DROP FUNCTION IF EXISTS recovery_lone_record",
    "DROP FUNCTION IF EXISTS recovery_lone_success",
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(RECORD)
        schema_editor.execute(SUCCESS)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in DROP:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("recovery", "0015_operation_indexes_unsettled_key")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
