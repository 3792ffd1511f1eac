"""The raw-psycopg baseline: the ledger's statements without Django and without hashing.

It issues the SQL text captured from one Django lifecycle, with parameters of the same
shape, in the same two transactions, on its own psycopg connection to the same database.
Keys, facts and links are computed before timing (they form valid chains, checked
afterwards), so the figure shows what the database and the driver allow from Python.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import psycopg
from django.db import connection
from workload import FLUSH, READ, Lifecycle

from recovery import chain
from recovery.api import FingerprintKind, canonical_bytes, fingerprint, fingerprint_value
from recovery.api import operation_key as derive_key
from recovery.keys import chain_keys
from recovery.services._ledger import ROW
from recovery.services.dispatch_write import packed_values
from recovery.services.step_parts import _CHECKPOINT_READ
from recovery.subjects import Subject

# What each captured statement must start with, in order (two transactions).
# On PostgreSQL the dispatch write's two inserts are one statement, a success's reads one
# (ADR 0035), and its update and checkpoint one (ADR 0050).
SHAPE = (
    (
        "SELECT seq, link FROM recovery_checkpoint",
        "WITH op AS (INSERT INTO recovery_operation",
    ),
    (
        # A run's success with no mark reads from its subject's seal (ADR 0070): none here.
        "WITH sealed AS (SELECT",
        "WITH up AS (UPDATE recovery_operation",
    ),
)


class StatementsChanged(RuntimeError):
    """The ledger no longer issues the statements this baseline mirrors."""


@dataclass(frozen=True)
class Prepared:
    """One lifecycle's values, computed before timing."""

    subject_type: str
    subject_id: str
    record: dict[str, Any]
    key: str
    recorded: tuple[str, str, str]  # fact, fact_fp, link
    observed: tuple[str, str, str]
    result_fp: str


def statements(log: list[tuple[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Split a captured lifecycle into its two transactions' SQL; check the shape."""
    groups: list[list[tuple[str, Any]]] = [[]]
    for kind, item in log:
        if kind == "commit":
            groups.append([])
        else:
            groups[-1].append(item)
    groups = [g for g in groups if g]
    got = [[sql for sql, _ in g] for g in groups]
    expected = [list(s) for s in SHAPE]
    ok = len(got) == len(expected) and all(
        len(g) == len(e) and all(sql.startswith(p) for sql, p in zip(g, e, strict=True))
        for g, e in zip(got, expected, strict=True)
    )
    if not ok:
        listing = "\n".join(f"  tx {i + 1}: {sql[:70]}" for i, g in enumerate(got) for sql in g)
        raise StatementsChanged(
            "The ledger's statements changed, so bench/baseline.py no longer mirrors them. "
            f"Update SHAPE and the parameter builders there. Captured:\n{listing}"
        )
    flat = [item for g in groups for item in g]
    return [sql for sql, _ in flat], [list(params) for _, params in flat]


def prepare(lifecycles: list[Lifecycle]) -> list[Prepared]:
    """Derive keys, facts, fact fingerprints and chain links as the ledger would."""
    keys = chain_keys()
    key_bytes = keys.keys[keys.active_id]
    heads: dict[Any, tuple[int, str]] = {}
    out = []
    for lc in lifecycles:
        r, fence = lc.record, lc.fence
        subject = r["subject"]
        key = derive_key(
            definition_fp=r["definition_fp"],
            step_id=r["step_id"],
            action=r["action"],
            input_fp=r["input_fp"],
            nonce=r["nonce"],
        )
        result_fp = fingerprint_value(FingerprintKind.RESULT, lc.result)
        recorded = {
            "operation": key,
            "state": "dispatched",
            "revision": 1,
            "step": r["step_id"],
            "action": r["action"],
            "mode": r["recovery_mode"],
            "definition_fp": r["definition_fp"],
            "input_fp": r["input_fp"],
            "preview_fp": r["preview_fp"],
            "access_fp": r["access_fp"],
            "idempotency_fp": r["idempotency_fp"],
            "result_fp": "",
            "lease": fence.key,
            "fence": fence.fence,
            "ordinal": r["ordinal"],
        }
        observed = {
            "operation": key,
            "state": "succeeded",
            "revision": 2,
            "result_fp": result_fp,
            "by_fence": fence.fence,
        }
        links = []
        seq, prev = heads.get(subject, (0, chain.EMPTY.link))
        for kind, fact in (("operation.recorded", recorded), ("operation.observed", observed)):
            seq += 1
            fact_text = canonical_bytes(fact).decode()
            fact_fp = fingerprint(FingerprintKind.FACT, fact_text.encode())
            prev = chain.compute_link(key_bytes, subject, seq, kind, fact_fp, prev)
            links.append((fact_text, fact_fp, prev))
        heads[subject] = (seq, prev)
        out.append(Prepared(subject.type, subject.id, r, key, links[0], links[1], result_fp))
    return out


def connect(*, server_side: bool) -> psycopg.Connection:
    """A psycopg connection to the benchmark database, without Django's adapters.

    ``server_side=False`` binds parameters in the client as Django's default cursor does
    (no prepared statements); ``True`` binds on the server and prepares each statement
    after its first use (``prepare_threshold=1``).
    """
    params = connection.get_connection_params()
    for name in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(name, None)
    return psycopg.connect(
        **params,
        autocommit=True,
        cursor_factory=psycopg.Cursor if server_side else psycopg.ClientCursor,
        prepare_threshold=1 if server_side else None,
    )


def lifecycle_runner(
    conn: psycopg.Connection, sql: list[str], log: list | None = None
) -> Callable[[Prepared], None]:
    """Return a function that runs one lifecycle with the captured statements."""
    head_sql, insert_both, load_all, observe_both = sql
    width = 1 + len(_CHECKPOINT_READ) + len(chain.OP_COLUMNS)  # where the ROW columns start
    at = {name: width + i for i, name in enumerate(ROW)}
    i_id, i_key, i_state, i_revision = at["id"], at["key"], at["state"], at["revision"]
    key_id = chain_keys().active_id
    cur = conn.cursor()

    def execute(statement: str, params: list[Any]) -> None:
        if log is not None:
            log.append((statement, params))
        cur.execute(statement, params)

    def one(p: Prepared) -> None:
        r, fence = p.record, p.record["fence"]
        st, sid = p.subject_type, p.subject_id
        with conn.transaction():
            execute(head_sql, [st, sid])
            head = cur.fetchone()
            seq, prev = (head[0], head[1]) if head else (0, chain.EMPTY.link)
            seq += 1
            fact, fact_fp, link = p.recorded
            execute(
                insert_both,
                [
                    # the operation's values as one JSON parameter (ADR 0060), then the
                    # fence its insert is conditional on
                    packed_values(
                        p.key, Subject(st, sid), r, fence, r["ordinal"], "dispatched", seq
                    ),
                    fence.key,
                    fence.holder,
                    fence.fence,
                    # its checkpoint, in the same statement
                    *(st, sid, seq, "operation.recorded", fact, fact_fp, prev, link, key_id, ""),
                ],
            )
            if not all(cur.fetchone()):  # recorded, chained, and the (no) first rows matched
                raise RuntimeError(f"baseline: the fence of {st}:{sid} is not live")
        with conn.transaction():
            execute(load_all, [p.key] * load_all.count("%s"))  # each the key
            rows = cur.fetchall()
            mine = next(row for row in rows if row[0] == 1 and row[i_key] == p.key)
            last = [row for row in rows if row[0] == 0][-1]
            seq, prev = last[1] + 1, last[6]
            fact, fact_fp, link = p.observed
            execute(
                observe_both,
                [
                    "succeeded",
                    mine[i_revision] + 1,
                    p.result_fp,
                    seq,
                    mine[i_id],
                    mine[i_state],
                    mine[i_revision],
                    fence.key,
                    fence.holder,
                    fence.fence,
                    st,
                    sid,
                    # its checkpoint, in the same statement
                    *(st, sid, seq, "operation.observed", fact, fact_fp, prev, link, key_id, ""),
                ],
            )
            if cur.fetchone() != (1,):
                raise RuntimeError(f"baseline: operation {p.key} did not move")

    return one


def check_shapes(captured: list[list[Any]], sql: list[str], replayed: list) -> None:
    """Fail loudly unless one replayed lifecycle matches Django's text and parameter shapes."""
    shapes = [[type(v).__name__ for v in params] for params in captured]
    got = [[type(v).__name__ for v in params] for _, params in replayed]
    if [s for s, _ in replayed] != sql or got != shapes:
        raise StatementsChanged(
            "baseline statements or parameter shapes differ from Django's: "
            f"expected {shapes}, got {got}"
        )


def run(one: Callable[[Prepared], None], prepared: list[Prepared]) -> float:
    start = perf_counter()
    for p in prepared:
        one(p)
    return perf_counter() - start


def xact_commit(conn: psycopg.Connection) -> tuple[int, int]:
    """Same protocol as ``workload.xact_commit``, on this connection."""
    conn.execute(FLUSH)
    with conn.transaction():
        conn.execute("SELECT pg_stat_clear_snapshot()")
        commits, autovacuum = conn.execute(READ).fetchone()
    conn.execute(FLUSH)
    return int(commits), int(autovacuum)


def floor(conn: psycopg.Connection, count: int = 1000) -> tuple[float, float]:
    """Return the µs of one round trip and of one durable write commit on this connection.

    A round trip is ``SELECT 1`` in autocommit (no WAL flush); a durable write commit is a
    one-row INSERT in autocommit (one round trip and a WAL flush).
    """
    conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (n integer)")
    for _ in range(100):
        conn.execute("SELECT 1")
    start = perf_counter()
    for _ in range(count):
        conn.execute("SELECT 1")
    round_trip = (perf_counter() - start) / count
    start = perf_counter()
    for n in range(count):
        conn.execute("INSERT INTO bench_floor (n) VALUES (%s)", [n])
    commit = (perf_counter() - start) / count
    return round_trip * 1e6, commit * 1e6
