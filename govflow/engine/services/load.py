"""Loading a run: the instance, its definition and its active steps, under its lease.

``load_run`` reads what a run (``run.Run``) starts from — the instance with its
definition's stored bytes, the newest projection its chain recorded, an open integrity
incident, whether a step of it is stuck (``writes.stuck_look_sql``), and its active
tokens — in two plain statements. Reads only.
"""

from __future__ import annotations

from django.db import connection

from recovery.api import (
    ConflictError,
    Fence,
    Subject,
    incident_open_sql,
    model_columns,
    projection_head_sql,
    rows_as,
)

from ..models import Token
from ..projection import SUBJECT_TYPE
from ..states import TOKEN_ACTIVE
from .definitions import instance_pinned
from .run import Run
from .writes import stuck_look_sql

__all__ = ["load_run", "run_reload"]


def load_run(instance_id: int, fence: Fence) -> Run | None:
    """The instance and its active tokens: two plain queries, the definition re-hashed.

    Reads only; the caller holds the instance's lease (``fence``).
    """
    quote = connection.ops.quote_name
    subject = Subject(SUBJECT_TYPE, str(instance_id))
    projection_sql, projection_params = projection_head_sql(subject)
    incident_sql, incident_params = incident_open_sql(subject)
    stuck_sql, stuck_params = stuck_look_sql(instance_id)
    loaded = instance_pinned(
        instance_id,
        extra=[
            (projection_sql, "recorded_projection", projection_params),
            (incident_sql, "integrity_incident", incident_params),
            (stuck_sql, "stuck_at_load", stuck_params),
        ],
    )
    if loaded is None:
        return None
    instance, pinned = loaded
    run = Run(
        instance=instance,
        spec=pinned.spec,
        fence=fence,
        definition_fp=pinned.fingerprint,
        recorded_projection=instance.recorded_projection or "",
        integrity_incident=instance.integrity_incident,
        committed_status=str(instance.status),
        stuck_at_load=bool(instance.stuck_at_load),
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {model_columns(Token)} FROM {quote(Token._meta.db_table)} "
            f"WHERE instance_id = %s AND state IN ({', '.join('%s' for _ in _ACTIVE)})",
            [instance_id, *_ACTIVE],
        )
        for token in rows_as(Token, cursor.fetchall()):
            run.active[token.pk] = token
    return run


_ACTIVE = sorted(str(state) for state in TOKEN_ACTIVE)


def run_reload(run: Run) -> None:
    """Read the instance and its active tokens again, after a refused commit (reads). The
    fence stays; plans made from the old view are the caller's to drop."""
    fresh = load_run(run.instance.pk, run.fence)
    if fresh is None:
        raise ConflictError(f"Instance {run.instance.pk} no longer exists.")
    run.reloaded(fresh)
