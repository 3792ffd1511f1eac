"""PostgreSQL: a success inside the caller's transaction checks its run's tail (ADR 0076).

``recovery_tail_observe`` is the success of ``recovery_lone_success`` (migration 0026) for
a caller's transaction: the stored rows past the run's mark compared with the ones the run
wrote, joined the same way, then the operation's compare-and-swap on state and revision
under the live lease with no open incident, then its checkpoint — one statement, planned
once per session. Unlike the lone function it never raises for a lost compare-and-swap of
the checkpoint (the caller's transaction would be aborted): the insert does nothing and
the answer says so. Its answer:

- ``''``: written;
- ``'tail'``: nothing written (the tail is not as the run wrote it, or the operation's move
  matched nothing): the caller reads and verifies in the same transaction, where every
  refusal is explained as always;
- ``'chain'``: the operation moved but another checkpoint took the position first: the
  caller raises the chain conflict and its transaction rolls back;
- ``'release'``: with ``p_release`` (the commit that ends an instance, sent alone: ADR
  0076), everything was written but the lease, checked a moment before, had lapsed when
  it was to be released; sent alone, the statement is then aborted whole.

``p_release`` releases the run's lease (as ``lease_release``) after the checkpoint: an
instance's ending is then one statement.

A mark at #0 is the run's chain from its beginning (ADR 0076): then every stored row of the
subject is compared, whatever its position, so the comparison is the whole chain's
verification an instance's end asks for (ADR 0038).
"""

import importlib

from django.db import migrations

_FRAMED = importlib.import_module("recovery.migrations.0022_tail_compared_as_framed_text")
_JOINED = importlib.import_module("recovery.migrations.0026_tail_joined_not_framed")

CHECKPOINTS = _JOINED.joined(_FRAMED.CP_COLUMNS)
OPERATIONS = _JOINED.joined(_FRAMED.OP_COLUMNS)

FUNCTION = f"""
CREATE OR REPLACE FUNCTION recovery_tail_observe(
    p_subject_type text, p_subject_id text, p_mark_seq bigint, p_mark_link text,
    p_checkpoints text, p_operations text, p_lease_key text, p_holder text, p_fence bigint,
    p_key text, p_from_state text, p_from_revision integer, p_state text, p_result_fp text,
    p_seq bigint, p_kind text, p_fact text, p_fact_fp text, p_prev_link text, p_link text,
    p_key_id text, p_projection_fp text, p_release boolean
) RETURNS text
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_answer text;
BEGIN
    WITH ok AS (
        SELECT (p_mark_seq = 0 OR EXISTS (
                    SELECT 1 FROM recovery_checkpoint WHERE subject_type = p_subject_type
                    AND subject_id = p_subject_id AND seq = p_mark_seq
                    AND link = p_mark_link))
            AND (SELECT string_agg({CHECKPOINTS}, E'\\x1e' ORDER BY c.seq)
                 FROM recovery_checkpoint c WHERE c.subject_type = p_subject_type
                 AND c.subject_id = p_subject_id AND (p_mark_seq = 0 OR c.seq > p_mark_seq))
                = p_checkpoints
            AND (SELECT string_agg({OPERATIONS}, E'\\x1e' ORDER BY o.key COLLATE "C")
                 FROM recovery_operation o WHERE o.subject_type = p_subject_type
                 AND o.subject_id = p_subject_id
                 AND (p_mark_seq = 0 OR o.chain_seq > p_mark_seq))
                = p_operations AS ok
    ),
    up AS (
        UPDATE recovery_operation SET state = p_state, revision = p_from_revision + 1,
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
        AND COALESCE((SELECT ok FROM ok), false)
        RETURNING 1
    ),
    cp AS (
        INSERT INTO recovery_checkpoint (subject_type, subject_id, seq, kind, fact, fact_fp,
            prev_link, link, key_id, projection_fp, recorded_at)
        SELECT p_subject_type, p_subject_id, p_seq, p_kind, p_fact, p_fact_fp, p_prev_link,
            p_link, p_key_id, p_projection_fp, clock_timestamp()
        WHERE EXISTS (SELECT 1 FROM up)
        ON CONFLICT (subject_type, subject_id, seq) DO NOTHING
        RETURNING 1
    ),
    released AS (
        UPDATE recovery_lease SET holder = NULL, expires_at = NULL,
            released_at = clock_timestamp()
        WHERE p_release AND key = p_lease_key AND holder = p_holder AND fence = p_fence
        AND expires_at > clock_timestamp() AND EXISTS (SELECT 1 FROM cp)
        RETURNING 1
    )
    SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM up) THEN 'tail'
                WHEN NOT EXISTS (SELECT 1 FROM cp) THEN 'chain'
                WHEN p_release AND NOT EXISTS (SELECT 1 FROM released) THEN 'release'
                ELSE '' END
    INTO v_answer;
    RETURN v_answer;
END;
$$;
"""

DROP = (
    "DROP FUNCTION IF EXISTS recovery_tail_observe(text, text, bigint, text, text, text, "
    "text, text, bigint, text, text, integer, text, text, bigint, text, text, text, text, "
    "text, text, text, boolean)"
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("recovery", "0026_tail_joined_not_framed")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
