"""Engine models: data, constraints and indexes. Writes go through ``services``."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from .external_tasks import ExternalTask, Refusal, ReportKind, TaskReport, TaskState
from .states import DeliveryState, InstanceStatus, TimerState, TokenState, WaitKind

NON_NEGATIVE = [MinValueValidator(0)]
"""The bound of the counters written at every step (ordinals, attempts, polls), checked by
the model's validation and the engine that computes them, not by a database CHECK
constraint: PostgreSQL parses and plans a table's CHECK constraints again at every
statement that writes a row of it (ADR 0061)."""

__all__ = [
    "ContractMigration",
    "Definition",
    "DeliveryState",
    "ExternalTask",
    "Incident",
    "Instance",
    "InstanceStatus",
    "KeptAnswer",
    "MigrationState",
    "Refusal",
    "ReportKind",
    "TaskReport",
    "TaskState",
    "Timer",
    "TimerState",
    "Token",
    "TokenState",
    "TriggerDelivery",
    "WaitKind",
]


class Definition(models.Model):
    """A published, immutable workflow version. A new version is a new row."""

    key = models.CharField(max_length=120)
    version = models.PositiveIntegerField()
    title = models.CharField(max_length=200)
    document = models.TextField(help_text="Canonical JSON bytes of the definition.")
    contracts = models.TextField(
        blank=True,
        default="",
        help_text="Canonical JSON of the action contracts pinned at publishing "
        "(empty: published before contracts were pinned).",
    )
    fingerprint = models.CharField(
        max_length=64,
        unique=True,
        help_text="BLAKE3 of the canonical document and contracts together.",
    )
    source = models.CharField(max_length=300, blank=True, default="")
    published_at = models.DateTimeField()
    published_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )

    class Meta:
        verbose_name = _("definition")
        verbose_name_plural = _("definitions")
        db_table = "engine_definition"
        constraints = [
            models.UniqueConstraint(fields=["key", "version"], name="engine_definition_version"),
        ]
        permissions = [("publish_definition", "Can publish workflow definitions")]

    def __str__(self) -> str:
        return f"{self.key} v{self.version}"


class Instance(models.Model):
    """One run of a definition, pinned to its fingerprint."""

    definition = models.ForeignKey(Definition, on_delete=models.PROTECT, related_name="instances")
    definition_fp = models.CharField(max_length=64)
    tenant = models.CharField(max_length=100)
    variables = models.JSONField(default=dict)
    access = models.JSONField(default=dict, help_text="Access context the steps run under.")
    status = models.CharField(
        max_length=12, choices=InstanceStatus.choices, default=InstanceStatus.RUNNING
    )
    reason = models.TextField(blank=True, default="")
    contracts = models.TextField(
        blank=True,
        default="",
        help_text="Canonical JSON of the action contracts operators migrated this instance "
        "to (by an approved migration); empty: the definition's own.",
    )
    next_ordinal = models.IntegerField(default=1, validators=NON_NEGATIVE)
    case = models.JSONField(
        default=list,
        blank=True,
        help_text="The definition's case fields read from the variables: [name, text] pairs "
        "in the declared order.",
    )
    case_text = models.TextField(
        blank=True, default="", help_text="The case fields lowercased: what search looks in."
    )
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)
    runnable_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Since when a worker may claim this instance (database clock); empty: "
        "nothing to run. Set in the commit that made it runnable (ADR 0026).",
    )
    wakeups = models.BigIntegerField(
        default=0,
        help_text="How often it was marked runnable: a run clears its mark only if nobody "
        "marked it again while it ran.",
    )

    class Meta:
        verbose_name = _("instance")
        verbose_name_plural = _("instances")
        db_table = "engine_instance"
        indexes = [
            models.Index(fields=["status"], name="engine_instance_status"),
            # The claim scans runnable instances by time; the others are not in the index.
            models.Index(
                fields=["runnable_at"],
                name="engine_instance_runnable",
                condition=models.Q(runnable_at__isnull=False),
            ),
        ]
        permissions = [
            ("start_instance", "Can start workflow instances"),
            ("operate_instance", "Can retry, cancel and resolve steps of instances"),
            (
                "migrate_instance",
                "Can request and approve moving an instance to an action's changed contract",
            ),
        ]

    def __str__(self) -> str:
        """The case in words: "Building permit #3 — T. Nowak, BP-2026-00001"."""
        title = self.definition.title if self.definition_id else "Instance"
        words = f"{title} #{self.pk}"
        values = [text for _, text in self.case or () if text]
        return f"{words} — {', '.join(values[:3])}" if values else words

    @property
    def case_map(self) -> dict[str, str]:
        """The case fields by name."""
        return {name: text for name, text in self.case or ()}


class Token(models.Model):
    """A position of an instance at a node."""

    # No index of its own: the unique (instance, ordinal) one serves every look-up by
    # instance, and the cascade, with its prefix (ADR 0046).
    instance = models.ForeignKey(
        Instance, on_delete=models.CASCADE, related_name="tokens", db_index=False
    )
    node_id = models.CharField(max_length=100)
    ordinal = models.IntegerField(
        help_text="Durable step ordinal within the instance.", validators=NON_NEGATIVE
    )
    state = models.CharField(max_length=16, choices=TokenState.choices)
    attempt = models.IntegerField(default=0, validators=NON_NEGATIVE)
    poll = models.IntegerField(default=0, validators=NON_NEGATIVE)
    wait_kind = models.CharField(max_length=10, choices=WaitKind.choices, blank=True, default="")
    wait_key = models.CharField(max_length=300, blank=True, default="")
    not_before = models.DateTimeField(null=True, blank=True)
    payload = models.JSONField(
        null=True, blank=True, help_text="Data delivered to a waiting token, merged on advance."
    )
    operation_key = models.CharField(max_length=80, blank=True, default="")
    idempotency_key = models.CharField(max_length=80, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        verbose_name = _("token")
        verbose_name_plural = _("tokens")
        db_table = "engine_token"
        constraints = [
            models.UniqueConstraint(fields=["instance", "ordinal"], name="engine_token_ordinal"),
        ]
        # Every token row version writes an entry into every index whose predicate it
        # meets (a state change is never a HOT update). The due index stays whole: made
        # partial over the active steps, the sweep's look-up for unmarked work scanned all
        # of it once per instance under stale statistics (ADR 0046, "Withdrawn").
        indexes = [
            models.Index(fields=["state", "not_before"], name="engine_token_due"),
            models.Index(
                fields=["wait_kind", "wait_key"],
                name="engine_token_wait",
                condition=Q(state="waiting"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node_id} #{self.ordinal} ({self.state})"


class Timer(models.Model):
    """A timer row with its own fence; the sweep fires it at its due time (database clock)."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="timers")
    token = models.OneToOneField(Token, on_delete=models.CASCADE, related_name="timer")
    due_at = models.DateTimeField()
    state = models.CharField(
        max_length=10, choices=TimerState.choices, default=TimerState.SCHEDULED
    )
    fire_fence = models.BigIntegerField(default=0, help_text="Fence of the sweep that fired it.")
    fired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("timer")
        verbose_name_plural = _("timers")
        db_table = "engine_timer"
        indexes = [models.Index(fields=["state", "due_at"], name="engine_timer_due")]

    def __str__(self) -> str:
        return f"Timer {self.pk} due {self.due_at} ({self.state})"


class TriggerDelivery(models.Model):
    """A message delivered with a correlation key; deduplicated by its delivery id."""

    delivery_id = models.CharField(max_length=200, unique=True)
    # The tenant whose steps may take the message; empty: any tenant's (a delivery made
    # by trusted code in this process, e.g. a module's own command). The REST API always
    # names the key's tenant.
    tenant = models.CharField(max_length=100, blank=True, default="")
    message = models.CharField(max_length=200)
    correlation = models.CharField(max_length=200)
    payload = models.JSONField(default=dict)
    state = models.CharField(
        max_length=10, choices=DeliveryState.choices, default=DeliveryState.RECEIVED
    )
    token = models.ForeignKey(
        Token, null=True, blank=True, on_delete=models.SET_NULL, related_name="deliveries"
    )
    consumer_fence = models.BigIntegerField(default=0)
    received_at = models.DateTimeField()
    consumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("trigger delivery")
        verbose_name_plural = _("trigger deliveries")
        db_table = "engine_trigger_delivery"
        indexes = [
            models.Index(fields=["message", "correlation", "state"], name="engine_delivery_match")
        ]

    def __str__(self) -> str:
        return f"{self.message}:{self.correlation} ({self.state})"


class Incident(models.Model):
    """Something an operator must look at: a failed step, a blocked instance, a bad gate."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="incidents")
    token = models.ForeignKey(
        Token, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    kind = models.CharField(max_length=40)
    message = models.TextField()
    created_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    # The recorded investigation: who resolved it, what they found, and the ids of the
    # evidence files they attached (recovery's, attached to the instance's subject).
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    resolution = models.TextField(blank=True, default="")
    resolution_evidence = models.JSONField(default=list, blank=True)

    class Meta:
        verbose_name = _("incident")
        verbose_name_plural = _("incidents")
        db_table = "engine_incident"

    def __str__(self) -> str:
        return f"{self.kind} on instance {self.instance_id}"


class KeptAnswer(models.Model):
    """A provider's answer that arrived when the ledger could not record it.

    A success is refused while an integrity incident is open on the instance (or its chain
    is broken). The provider did answer, so the answer is kept here — with the output the
    next steps need — and recorded through the normal path once the incident is resolved;
    the step is never turned into ``outcome_unknown`` for it.
    """

    class Outcome(models.TextChoices):
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        PENDING = "pending", "Pending"
        UNKNOWN = "unknown", "Not conclusive"

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="kept_answers")
    token = models.ForeignKey(Token, on_delete=models.CASCADE, related_name="+")
    operation_key = models.CharField(max_length=80, unique=True)
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    output = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    permanent = models.BooleanField(default=False)
    poll_after = models.FloatField(null=True, blank=True)
    received_at = models.DateTimeField()
    applied_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("kept answer")
        verbose_name_plural = _("kept answers")
        db_table = "engine_kept_answer"

    def __str__(self) -> str:
        return f"Kept answer ({self.outcome}) for {self.operation_key[:15]}…"


class MigrationState(models.TextChoices):
    REQUESTED = "requested", "Requested"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"


class ContractMigration(models.Model):
    """An operator's request to run an instance under an action's changed contract.

    A second person approves it (four eyes); only then is the instance's pinned contract
    for that action replaced. Request and approval are facts on the instance's chain.
    """

    instance = models.ForeignKey(
        Instance, on_delete=models.CASCADE, related_name="contract_migrations"
    )
    action = models.CharField(max_length=200)
    pinned = models.JSONField(help_text="The contract the instance was pinned to.")
    accepted = models.JSONField(help_text="The provider's contract the request accepts.")
    rationale = models.TextField()
    state = models.CharField(
        max_length=10, choices=MigrationState.choices, default=MigrationState.REQUESTED
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    requested_at = models.DateTimeField()
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The approver (or whoever rejected it).",
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True, default="")

    class Meta:
        verbose_name = _("contract migration")
        verbose_name_plural = _("contract migrations")
        db_table = "engine_contract_migration"
        constraints = [
            models.UniqueConstraint(
                fields=["instance", "action"],
                condition=Q(state="requested"),
                name="engine_one_open_migration_per_action",
            ),
            models.CheckConstraint(
                condition=~Q(state="approved") | ~Q(decided_by=models.F("requested_by")),
                name="engine_migration_four_eyes",
            ),
        ]

    def __str__(self) -> str:
        return f"Migration of {self.action} on instance {self.instance_id} ({self.state})"


# Kept inputs and outputs of compensable steps (its own module: this one is full).
from .compensable import CompensableEffect  # noqa: E402, F401

# What a linked run's other module said (its own module, like the one above).
from .linked_models import LinkedRun, LinkedState  # noqa: E402, F401
