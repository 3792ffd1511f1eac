"""Every ``GOVFLOW_*`` setting of the engine: its default, type, unit and meaning, read lazily.

One table, so a default lives in one place: the accessors below read ``django.conf.settings``
when first called (never at import time; kept until a setting changes, ADR 0071), fall
back to the default here, and convert to the setting's type. ``checks.check_settings``
refuses values of the wrong type or out of range, and the settings table of
``docs/deployment.md`` is generated from :data:`SETTINGS` (:func:`settings_table`; a test
keeps the two equal).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from recovery.api import kept_setting

__all__ = [
    "SETTINGS",
    "Setting",
    "chain_audit_interval",
    "chain_audit_settle",
    "chain_audit_subjects",
    "definition_max_bytes",
    "delivery_lease_ttl",
    "lease_ttl",
    "max_steps_per_run",
    "operator_lease_ttl",
    "payload_max_bytes",
    "run_budget",
    "runs_per_worker",
    "settings_table",
    "shared_commit_wait",
    "sweep_duration",
    "sweep_full_every",
    "sweep_lease_ttl",
    "sweep_tick",
    "sweep_timer_batch",
    "variables_max_bytes",
    "worker_runs",
]


@dataclass(frozen=True)
class Setting:
    """One engine setting. ``environment``: ``govflow.settings.base`` reads it from an
    environment variable of the same name; otherwise set it in a settings module."""

    name: str
    default: int | float
    type: type
    unit: str
    environment: bool
    description: str
    shown: str = ""
    """The default as the documentation and the checks' hints say it, when it is not one
    value."""

    def value(self) -> int | float:
        return self.type(kept_setting(self.name, self.default))

    def shown_default(self) -> str:
        if self.shown:
            return self.shown
        text = f"`{self.default}`"
        if self.unit == "bytes":
            kib = self.default // 1024
            return f"{text} ({kib // 1024} MiB)" if kib % 1024 == 0 else f"{text} ({kib} KiB)"
        return f"{text} ({self.unit})" if self.unit else text


LEASE_TTL = Setting(
    "GOVFLOW_LEASE_TTL",
    30,
    float,
    "seconds",
    True,
    "the instance lease a worker holds while it runs an instance. It is renewed between "
    "steps once a third of it has passed, and every third of it by a background thread "
    "while a provider call runs, so a slow but live call keeps its authority. If the "
    "worker dies, the lease expires after this long — unless the worker was a process of "
    "the sweeper's own host, or (PostgreSQL) a cluster process whose liveness lock is "
    "free, whose death the sweeper sees at once (`govflow/engine/liveness.py`, ADR 0022). "
    "If renewal fails (the database was unreachable for a "
    "whole lease), another worker may take the instance over and record the step "
    "`outcome_unknown`; the first worker's late answer is then refused and changes "
    "nothing. Must be longer than `GOVFLOW_SWEEP_TICK`.",
)
OPERATOR_LEASE_TTL = Setting(
    "GOVFLOW_OPERATOR_LEASE_TTL",
    30,
    float,
    "seconds",
    False,
    "the instance lease an operator's change holds while it is made (cancel, retry, an "
    "approval, a decision's approval, a contract migration); released when the change "
    'commits. While a worker holds the instance, the change is refused with "try again".',
)
DELIVERY_LEASE_TTL = Setting(
    "GOVFLOW_DELIVERY_LEASE_TTL",
    30,
    float,
    "seconds",
    False,
    "the lease a trigger message's hand-over to its waiting step holds (one short commit). "
    "A consumer that dies mid-way leaves the message received; the sweep hands it over "
    "once this lease has expired.",
)
MAX_STEPS_PER_RUN = Setting(
    "GOVFLOW_MAX_STEPS_PER_RUN",
    500,
    int,
    "",
    True,
    "steps one run (one `advance` task) takes before it marks the instance runnable again "
    "and stops",
)
RUN_BUDGET = Setting(
    "GOVFLOW_RUN_BUDGET",
    25,
    float,
    "seconds",
    True,
    "a run starts no new step after this long and marks the instance runnable again: well "
    "inside "
    "django-q2's `timeout` (60 s), so a worker is not killed by the timeout mid-step",
)
CLUSTER_RUNS = Setting(
    "GOVFLOW_CLUSTER_RUNS",
    24,
    int,
    "",
    True,
    "instance runs one `qcluster` runs at once across its worker processes, when "
    "`GOVFLOW_WORKER_RUNS` is not set: each worker process runs this many divided by "
    "`Q_CLUSTER['workers']`, rounded up, but never fewer than 8, so that its runs still "
    "share their commits (ADR 0062): 24 with 1 worker, 12 each with the default 2, 8 each "
    "with 3 or more (ADR 0067)",
)
WORKER_RUNS = Setting(
    "GOVFLOW_WORKER_RUNS",
    0,
    int,
    "",
    True,
    "instance runs one `qcluster` worker process runs at once, each in a thread of its own "
    "with its own lease, fence and database connection (ADR 0041): a run mostly waits on "
    "PostgreSQL, and the runs overlap their waits. Unset: `GOVFLOW_CLUSTER_RUNS` divided "
    "among the worker processes, at least 8 (ADR 0067). The cluster claims `workers` x this many "
    "instances at a time and holds up to `workers` x this many PostgreSQL connections for "
    'the runs (`docs/deployment.md`, "Connections"). On SQLite always 1 (one writer at a '
    "time): a value above 1 is ignored there, with a warning",
    shown="`GOVFLOW_CLUSTER_RUNS` / workers, at least `8`",
)
SHARED_COMMIT_WAIT = Setting(
    "GOVFLOW_SHARED_COMMIT_WAIT",
    0.005,
    float,
    "seconds",
    True,
    "with `GOVFLOW_WORKER_RUNS` > 1 (PostgreSQL), the runs of one worker process send their "
    "chained steps in shared commits: the first step ready to commit waits at most this "
    "long for the process's other runs that are not in a provider call, then sends every "
    "step then waiting as one transaction, each step checked on its own fence (ADR 0062). "
    "Fewer, larger commits; at most this much later per step. A run alone never waits",
)
SWEEP_LEASE_TTL = Setting(
    "GOVFLOW_SWEEP_LEASE_TTL",
    10,
    float,
    "seconds",
    True,
    "the `govflow:sweeper` lease that keeps the sweeper single; a sweeper that died is "
    "replaced by a standby (every `qcluster`'s main process has one) as soon as it "
    "expires. A sweep task that finds a live sweeper leaves at once; one whose lease is "
    "running out waits up to this plus 1 s for it. Must be longer than "
    "`GOVFLOW_SWEEP_TICK` (it is renewed at the end of the first pass after a quarter of "
    "it has passed).",
)
SWEEP_TICK = Setting(
    "GOVFLOW_SWEEP_TICK",
    0.25,
    float,
    "seconds",
    True,
    "pause between sweep passes when no full batch of timers fired",
)
SWEEP_FULL_EVERY = Setting(
    "GOVFLOW_SWEEP_FULL_EVERY",
    2,
    float,
    "seconds",
    False,
    "how often a pass also retries buffered trigger messages",
)
SWEEP_TIMER_BATCH = Setting(
    "GOVFLOW_SWEEP_TIMER_BATCH",
    2000,
    int,
    "",
    False,
    "due timers fired, and their instances marked runnable, in one commit; a full batch is "
    "followed by the next at once",
)
SWEEP_DURATION = Setting(
    "GOVFLOW_SWEEP_DURATION",
    40,
    float,
    "seconds",
    True,
    "how long one sweep *task* (the fallback, below) loops before it enqueues its "
    "successor. Keep it below the django-q2 `timeout` (60 s), or the task is killed every "
    "time. The sweeper in a `qcluster`'s main process has no such limit.",
)
CHAIN_AUDIT_INTERVAL = Setting(
    "GOVFLOW_CHAIN_AUDIT_INTERVAL",
    60,
    float,
    "seconds",
    False,
    "how often the sweeper runs a pass of the periodic chain audit at most (ADR 0038): "
    "each pass verifies, with the anchors, the whole chains that grew since the audit "
    "last verified them, and opens an integrity incident for a broken one. A pass that "
    "found more waiting is followed by the next at once",
)
CHAIN_AUDIT_SUBJECTS = Setting(
    "GOVFLOW_CHAIN_AUDIT_SUBJECTS",
    20,
    int,
    "",
    False,
    "chains one audit pass verifies at most (each whole, once however much it grew); the "
    "audit's progress is kept in the database, so a restart goes on where it stopped",
)
CHAIN_AUDIT_SETTLE = Setting(
    "GOVFLOW_CHAIN_AUDIT_SETTLE",
    60,
    float,
    "seconds",
    False,
    "checkpoints younger than this (database clock) wait for a later audit pass, so one "
    "written by a commit still in flight is never passed over; keep it above the longest "
    "engine transaction",
)
DEFINITION_MAX_BYTES = Setting(
    "GOVFLOW_DEFINITION_MAX_BYTES",
    1024 * 1024,
    int,
    "bytes",
    False,
    "largest definition: the admin's upload, a `load_workflows` file, and the canonical "
    "bytes `definition_publish` stores",
)
VARIABLES_MAX_BYTES = Setting(
    "GOVFLOW_VARIABLES_MAX_BYTES",
    256 * 1024,
    int,
    "bytes",
    False,
    "largest variables an instance starts with, from the *start an instance* form and from "
    "`instance_start` alike (also its access context)",
)
PAYLOAD_MAX_BYTES = Setting(
    "GOVFLOW_PAYLOAD_MAX_BYTES",
    256 * 1024,
    int,
    "bytes",
    False,
    "largest payload of a trigger message (`trigger_deliver`) or an external task's result "
    "(`external_complete`)",
)

SETTINGS: tuple[Setting, ...] = (
    LEASE_TTL,
    OPERATOR_LEASE_TTL,
    DELIVERY_LEASE_TTL,
    MAX_STEPS_PER_RUN,
    RUN_BUDGET,
    CLUSTER_RUNS,
    WORKER_RUNS,
    SHARED_COMMIT_WAIT,
    SWEEP_LEASE_TTL,
    SWEEP_TICK,
    SWEEP_FULL_EVERY,
    SWEEP_TIMER_BATCH,
    SWEEP_DURATION,
    CHAIN_AUDIT_INTERVAL,
    CHAIN_AUDIT_SUBJECTS,
    CHAIN_AUDIT_SETTLE,
    DEFINITION_MAX_BYTES,
    VARIABLES_MAX_BYTES,
    PAYLOAD_MAX_BYTES,
)


def lease_ttl() -> float:
    return LEASE_TTL.value()


def operator_lease_ttl() -> float:
    return OPERATOR_LEASE_TTL.value()


def delivery_lease_ttl() -> float:
    return DELIVERY_LEASE_TTL.value()


def max_steps_per_run() -> int:
    return MAX_STEPS_PER_RUN.value()


def run_budget() -> float:
    return RUN_BUDGET.value()


def worker_runs() -> int:
    """Runs at once per worker process: 1 on SQLite; on PostgreSQL the setting, or when it
    is not set the cluster's runs (``GOVFLOW_CLUSTER_RUNS``) divided among its worker
    processes, rounded up (ADR 0067)."""
    from django.db import DEFAULT_DB_ALIAS, connections

    if connections[DEFAULT_DB_ALIAS].vendor != "postgresql":
        return 1
    if getattr(settings, WORKER_RUNS.name, None) is not None:
        return WORKER_RUNS.value()
    from django_q.conf import Conf

    return runs_per_worker(CLUSTER_RUNS.value(), int(Conf.WORKERS or 1))


MIN_WORKER_RUNS = 8
"""The fewest runs per worker process by default: a process's chained steps commit
together (ADR 0062), and fewer runs make smaller, more numerous commits."""


def runs_per_worker(cluster_runs: int, workers: int) -> int:
    """``cluster_runs`` divided among ``workers`` worker processes, rounded up, and never
    fewer than :data:`MIN_WORKER_RUNS` (ADR 0067)."""
    return max(MIN_WORKER_RUNS, -(-cluster_runs // max(1, workers)))


def shared_commit_wait() -> float:
    return SHARED_COMMIT_WAIT.value()


def sweep_lease_ttl() -> float:
    return SWEEP_LEASE_TTL.value()


def sweep_tick() -> float:
    return SWEEP_TICK.value()


def sweep_full_every() -> float:
    return SWEEP_FULL_EVERY.value()


def sweep_timer_batch() -> int:
    return SWEEP_TIMER_BATCH.value()


def sweep_duration() -> float:
    return SWEEP_DURATION.value()


def chain_audit_interval() -> float:
    return CHAIN_AUDIT_INTERVAL.value()


def chain_audit_subjects() -> int:
    return CHAIN_AUDIT_SUBJECTS.value()


def chain_audit_settle() -> float:
    return CHAIN_AUDIT_SETTLE.value()


def definition_max_bytes() -> int:
    return DEFINITION_MAX_BYTES.value()


def variables_max_bytes() -> int:
    return VARIABLES_MAX_BYTES.value()


def payload_max_bytes() -> int:
    return PAYLOAD_MAX_BYTES.value()


def settings_table() -> str:
    """The Markdown table of :data:`SETTINGS`, as ``docs/deployment.md`` shows it."""
    rows = [
        "| setting | default | from the environment | meaning |",
        "|---|---|---|---|",
    ]
    for s in SETTINGS:
        env = "yes (`base`)" if s.environment else "no"
        rows.append(f"| `{s.name}` | {s.shown_default()} | {env} | {s.description} |")
    return "\n".join(rows) + "\n"
