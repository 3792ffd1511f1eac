"""PostgreSQL: a chained step's ledger call runs four statements, not eight (ADR 0068).

``recovery_tail_observe_record`` (migrations 0018, 0022) checked the run's written tail,
looked step k's operation up by its key, and then called ``recovery_observe_record``
(migration 0011), which checked the chain's head, moved step k's operation, inserted its
checkpoint, inserted step k+1's operation and its checkpoint: eight statements run by the
executor, each set up and torn down anew, and a second function call with its 38
arguments. At the server a statement's set-up cost more than its work (``bench/
instructions.py``: executor set-up 31 % of the server's instructions per step, the ledger
functions 43 %).

Now the tail function writes itself, in four statements:

1. the tail check and the head check, one statement (two answers): the head the links
   were computed from still has its link;
2. step k's operation moved, found by its key (the look-up by key was a statement of its
   own, then the move by id);
3. both checkpoints, one ``INSERT`` of two rows;
4. step k+1's operation, with its checks, but for the fence: step 2 checked it, and its
   ``FOR SHARE`` holds the lease row until the commit, so no takeover comes between.

The conditions and answers are those of the two functions before: ``'tail'`` (the stored
rows past the mark are not the ones the run wrote, or step k's operation is not there),
``'head'``, ``'observe'``, ``'chain'``, ``'record'``; a condition's failure is found by
the same question, and the caller rolls everything back. One order moved: both
checkpoints are inserted before step k+1's operation, so when the second checkpoint's
position is taken *and* step k+1's operation is refused, the answer is ``'chain'`` where it
was ``'record'``; either way nothing is written. ``recovery_observe_record`` stays as it
was: a run's first chained step (which reads and verifies the chain) calls it.
"""

import importlib

from django.db import migrations

_FRAMED = importlib.import_module("recovery.migrations.0022_tail_compared_as_framed_text")

FUNCTION = f"""
CREATE OR REPLACE FUNCTION recovery_tail_observe_record(
    p_subject_type text, p_subject_id text, p_mark_seq bigint, p_mark_link text,
    p_checkpoints text, p_operations text,
    p_lease_key text, p_holder text, p_fence bigint,
    p_op text, p_next text, p_blocking text[], p_ledger_type text, p_ledger_id text,
    p_key_id text, p_links text, p_observed_fact text, p_recorded_fact text
) RETURNS text LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_op jsonb := p_op::jsonb;
    v_next jsonb := p_next::jsonb;
    v_links jsonb := p_links::jsonb;
    -- The head the links were computed from: the last checkpoint the run wrote.
    v_head_seq bigint := (v_op ->> 6)::bigint;
    v_head_link text := v_op ->> 7;
    v_tail boolean;
    v_head boolean;
    v_written integer;
BEGIN
    -- 1. The stored rows past the run's mark are the ones it wrote (each side framed the
    --    same way, migration 0022), and the chain still ends where the links were
    --    computed (migration 0011's first check).
    SELECT COALESCE(
        (p_mark_seq = 0 OR EXISTS (
            SELECT 1 FROM recovery_checkpoint WHERE subject_type = p_subject_type
            AND subject_id = p_subject_id AND seq = p_mark_seq AND link = p_mark_link))
        AND (SELECT string_agg({_FRAMED.framed(_FRAMED.CP_COLUMNS)}, '' ORDER BY c.seq)
             FROM recovery_checkpoint c WHERE c.subject_type = p_subject_type
             AND c.subject_id = p_subject_id AND c.seq > p_mark_seq)
            = p_checkpoints
        AND (SELECT string_agg({_FRAMED.framed(_FRAMED.OP_COLUMNS)}, ''
                                ORDER BY o.key COLLATE "C")
             FROM recovery_operation o WHERE o.subject_type = p_subject_type
             AND o.subject_id = p_subject_id AND o.chain_seq > p_mark_seq)
            = p_operations,
        false),
        v_head_seq <= 0 OR EXISTS (
            SELECT 1 FROM recovery_checkpoint WHERE subject_type = p_subject_type
            AND subject_id = p_subject_id AND seq = v_head_seq AND link = v_head_link)
    INTO v_tail, v_head;
    IF NOT v_tail THEN
        RETURN 'tail';
    END IF;
    IF NOT v_head THEN
        IF NOT EXISTS (SELECT 1 FROM recovery_operation WHERE key = v_op ->> 0) THEN
            RETURN 'tail';
        END IF;
        RETURN 'head';
    END IF;
    -- 2. Step k observed: compare-and-swap on state and revision, the fence inside the
    --    write (ADR 0003), no open incident for a success.
    UPDATE recovery_operation SET state = v_op ->> 3,
        revision = (v_op ->> 2)::integer + 1, result_fp = v_op ->> 4,
        chain_seq = v_head_seq + 1, updated_at = clock_timestamp()
    WHERE key = v_op ->> 0 AND state = v_op ->> 1 AND revision = (v_op ->> 2)::integer
    AND EXISTS (
        SELECT 1 FROM recovery_lease WHERE key = p_lease_key AND holder = p_holder
        AND fence = p_fence AND expires_at > clock_timestamp() FOR SHARE
    )
    AND (NOT (v_op ->> 5)::boolean OR NOT EXISTS (
        SELECT 1 FROM recovery_incident WHERE subject_type = p_subject_type
        AND subject_id = p_subject_id AND status = 'open'
    ));
    IF NOT FOUND THEN
        IF NOT EXISTS (SELECT 1 FROM recovery_operation WHERE key = v_op ->> 0) THEN
            RETURN 'tail';
        END IF;
        RETURN 'observe';
    END IF;
    -- 3. Both checkpoints: the unique (subject, seq) constraint is the compare-and-swap
    --    (ADR 0002).
    INSERT INTO recovery_checkpoint (subject_type, subject_id, seq, kind, fact, fact_fp,
        prev_link, link, key_id, projection_fp, recorded_at)
    VALUES (p_subject_type, p_subject_id, v_head_seq + 1, v_links ->> 0, p_observed_fact,
        v_links ->> 1, v_head_link, v_links ->> 2, p_key_id, v_links ->> 3,
        clock_timestamp()),
        (p_subject_type, p_subject_id, v_head_seq + 2, v_links ->> 4, p_recorded_fact,
        v_links ->> 5, v_links ->> 2, v_links ->> 6, p_key_id, v_links ->> 7,
        clock_timestamp())
    ON CONFLICT (subject_type, subject_id, seq) DO NOTHING;
    GET DIAGNOSTICS v_written = ROW_COUNT;
    IF v_written < 2 THEN
        RETURN 'chain';
    END IF;
    -- 4. Step k+1 recorded: the dispatch write with its checks (ADR 0009). The fence was
    --    checked by step 2, whose FOR SHARE holds the lease row until the commit: no
    --    takeover (an UPDATE of that row) can come between.
    INSERT INTO recovery_operation (key, subject_type, subject_id, step_id, action,
        recovery_mode, definition_fp, input_fp, preview_fp, access_fp, idempotency_fp,
        result_fp, lease_key, fence, ordinal, state, revision, chain_seq, recorded_at,
        updated_at)
    SELECT v_next ->> 0, p_subject_type, p_subject_id, v_next ->> 1, v_next ->> 2,
        v_next ->> 3, v_next ->> 4, v_next ->> 5, v_next ->> 6, v_next ->> 7,
        v_next ->> 8, '', p_lease_key, p_fence, (v_next ->> 9)::integer, v_next ->> 10, 1,
        v_head_seq + 2, clock_timestamp(), clock_timestamp()
    WHERE NOT EXISTS (
        SELECT 1 FROM recovery_incident WHERE status = 'open' AND (
            (subject_type = p_subject_type AND subject_id = p_subject_id)
            OR (subject_type = p_ledger_type AND subject_id = p_ledger_id))
    )
    AND NOT EXISTS (
        SELECT 1 FROM recovery_operation WHERE idempotency_fp = v_next ->> 8
        AND state = ANY(p_blocking)
    )
    ON CONFLICT (key) DO NOTHING;
    IF NOT FOUND THEN
        RETURN 'record';
    END IF;
    RETURN '';
END;
$$;
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_FRAMED.FUNCTION)


class Migration(migrations.Migration):
    dependencies = [("recovery", "0024_chain_mark")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
