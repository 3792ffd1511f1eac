"""Loading a run: the instance, its definition and its active steps, under its lease.

``load_run`` reads what a run (``run.Run``) starts from — the instance with its
definition's stored bytes, the newest projection its chain recorded, an open integrity
incident, whether a step of it is stuck (``writes.stuck_look_sql``), and its active
tokens — in two plain statements. Reads only. A claimed run on PostgreSQL reads the same
in one statement with its lease's handover in front (``handed_over_and_loaded``, ADR
0060).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection

from recovery.api import (
    ConflictError,
    Fence,
    Subject,
    incident_open_sql,
    lease_handover_reading,
    projection_head_sql,
    rows_as,
)

from ..models import Instance, Token
from ..projection import SUBJECT_TYPE
from ..token_reads import active_select
from .definitions import instance_pinned, pinned_of, pinned_select, pinned_width
from .run import Run
from .writes import stuck_look_sql

__all__ = ["handed_over_and_loaded", "load_run", "run_reload"]


def load_run(instance_id: int, fence: Fence) -> Run | None:
    """The instance and its active tokens: two plain queries, the definition re-hashed.

    Reads only; the caller holds the instance's lease (``fence``).
    """
    extra = _extra(instance_id)
    loaded = instance_pinned(instance_id, extra=extra)
    if loaded is None:
        return None
    run = _run(*loaded, fence)
    sql, params = active_select(instance_id)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        _add_tokens(run, cursor.fetchall())
    return run


def handed_over_and_loaded(
    instance_id: int, *, claimed: Fence, holder: str, ttl: float
) -> tuple[Fence, Run | None]:
    """The claim's lease handed over to ``holder`` and what :func:`load_run` reads, in
    one statement (PostgreSQL; ADR 0060): the instance row with its definition and the
    load's answers, and its active tokens, told apart by a leading part number.

    Needs the caller's transaction: the run's first commit closes it (``handover``).
    Raises ``StaleFence`` (nothing changed) when the claim's lease is no longer live.
    """
    extra = _extra(instance_id)
    width, token_width = pinned_width(extra), len(Token._meta.concrete_fields)
    instance_sql, instance_params = pinned_select(
        instance_id, extra, lead="0 AS part, ", tail=", NULL" * token_width
    )
    tokens_sql, tokens_params = active_select(instance_id, lead="1" + ", NULL" * width + ", ")
    fence, rows = lease_handover_reading(
        fence=claimed,
        holder=holder,
        ttl=ttl,
        reads=f"{instance_sql} UNION ALL {tokens_sql}",
        params=[*instance_params, *tokens_params],
    )
    found = [row[1 : width + 1] for row in rows if row[0] == 0]
    if not found:
        return fence, None
    run = _run(*pinned_of(found[0], extra), fence)
    _add_tokens(run, [row[width + 1 :] for row in rows if row[0] == 1])
    return fence, run


def _extra(instance_id: int) -> list[tuple[str, str, list[Any]]]:
    """The load's answers beside the instance row: the newest recorded projection, an
    open integrity incident, whether a step of it is stuck."""
    subject = Subject(SUBJECT_TYPE, str(instance_id))
    projection_sql, projection_params = projection_head_sql(subject)
    incident_sql, incident_params = incident_open_sql(subject)
    stuck_sql, stuck_params = stuck_look_sql(instance_id)
    return [
        (projection_sql, "recorded_projection", projection_params),
        (incident_sql, "integrity_incident", incident_params),
        (stuck_sql, "stuck_at_load", stuck_params),
    ]


def _run(instance: Instance, pinned, fence: Fence) -> Run:
    return Run(
        instance=instance,
        spec=pinned.spec,
        fence=fence,
        definition_fp=pinned.fingerprint,
        recorded_projection=instance.recorded_projection or "",
        integrity_incident=instance.integrity_incident,
        committed_status=str(instance.status),
        stuck_at_load=bool(instance.stuck_at_load),
    )


def _add_tokens(run: Run, rows: Sequence[Sequence[Any]]) -> None:
    for token in rows_as(Token, rows):
        run.active[token.pk] = token


def run_reload(run: Run) -> None:
    """Read the instance and its active tokens again, after a refused commit (reads). The
    fence stays; plans made from the old view are the caller's to drop."""
    fresh = load_run(run.instance.pk, run.fence)
    if fresh is None:
        raise ConflictError(f"Instance {run.instance.pk} no longer exists.")
    run.reloaded(fresh)
