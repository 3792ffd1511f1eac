"""Request and response shapes. Requests are parsed here; responses are shaped here.

Responses are built as plain dicts by the views' presenters and passed through these
serializers, so what is sent is exactly what the OpenAPI schema says.
"""

from __future__ import annotations

import re

from rest_framework import serializers

from govflow.engine.linked_models import LinkedState
from govflow.engine.models import InstanceStatus, TokenState

from .request_shape import RequestShape

DELIVERY_ID = re.compile(r"^[A-Za-z0-9._~-]{1,99}\Z")


class Problem(serializers.Serializer):
    """An RFC 9457 problem (application/problem+json)."""

    type = serializers.CharField(help_text="A URI reference naming the problem type.")
    title = serializers.CharField(help_text="What happened, the same for every occurrence.")
    status = serializers.IntegerField(help_text="The HTTP status code.")
    detail = serializers.CharField(help_text="This occurrence in words: what to do next.")
    code = serializers.CharField(help_text="The problem type's last part, e.g. 'not-found'.")
    instance = serializers.CharField(required=False, help_text="The request it answers.")
    errors = serializers.ListField(
        child=serializers.DictField(child=serializers.CharField()),
        required=False,
        help_text="For validation problems: one {field, detail} per problem.",
    )


# ---- requests ------------------------------------------------------------------------


class TenantField(serializers.CharField):
    def __init__(self, **kwargs):
        super().__init__(
            required=False,
            max_length=100,
            help_text="For signed-in users: the tenant to act for, one of theirs (needed when "
            "they have several). An API key always acts for its own tenant (naming another "
            "is refused).",
            **kwargs,
        )


class InstanceStartRequest(RequestShape):
    definition = serializers.CharField(
        max_length=120, help_text="The key of a published definition, e.g. 'permits.building'."
    )
    version = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=2_147_483_647,
        help_text="The version to start; the latest published one if left out.",
    )
    variables = serializers.DictField(
        required=False,
        default=dict,
        help_text="The case variables, checked against the definition's variables schema "
        "(at most GOVFLOW_VARIABLES_MAX_BYTES of canonical JSON).",
    )
    tenant = TenantField()


class InstanceCancelRequest(RequestShape):
    reason = serializers.CharField(
        max_length=2000, help_text="Why the instance is cancelled; kept with the instance."
    )


class TriggerDeliveryRequest(RequestShape):
    message = serializers.CharField(max_length=200, help_text="The message name.")
    correlation = serializers.CharField(
        max_length=200, help_text="The value the waiting instance is correlated by."
    )
    delivery_id = serializers.RegexField(
        DELIVERY_ID,
        max_length=99,
        help_text="Your id of this message (letters, digits, '.', '_', '~', '-'; at most 99). "
        "Delivering the same id again is answered as the first delivery was.",
        error_messages={
            "invalid": "Use 1 to 99 letters, digits, '.', '_', '~' or '-' (a UUID works)."
        },
    )
    payload = serializers.DictField(
        required=False, default=dict, help_text="Data handed to the waiting step."
    )
    tenant = TenantField()


class DefinitionDocument(serializers.Serializer):
    """A workflow definition document (docs/definitions.md). Unknown fields are refused by
    the engine's validation, which lists every problem."""

    key = serializers.CharField(help_text="Namespaced lowercase words, e.g. 'permits.building'.")
    version = serializers.IntegerField(min_value=1, help_text="A positive integer.")
    title = serializers.CharField()
    description = serializers.CharField(required=False)
    variables = serializers.DictField(
        required=False, help_text="A JSON Schema the start variables must match."
    )
    nodes = serializers.ListField(child=serializers.DictField())
    transitions = serializers.ListField(child=serializers.DictField())


# ---- responses -----------------------------------------------------------------------


class DefinitionSummary(serializers.Serializer):
    key = serializers.CharField()
    version = serializers.IntegerField()
    title = serializers.CharField()
    fingerprint = serializers.CharField(help_text="BLAKE3 of the document and its contracts.")
    published_at = serializers.DateTimeField()
    url = serializers.CharField()


class DefinitionDetail(DefinitionSummary):
    versions = serializers.ListField(
        child=serializers.IntegerField(), help_text="Every published version of this key."
    )
    runnable = serializers.BooleanField(help_text="Whether new instances can start now.")
    not_runnable_because = serializers.CharField(
        allow_blank=True, help_text="Why not, when not runnable ('' otherwise)."
    )
    variables_schema = serializers.JSONField(  # any value, null included (no allow_null:
        # drf-spectacular would add a null branch that the "any value" branch also matches)
        help_text="The JSON Schema start variables must match, or null."
    )
    document = serializers.DictField(help_text="The published document.")
    contracts = serializers.DictField(
        help_text="The action contracts pinned at publishing (recovery mode, checks, "
        "input schema fingerprint), by action."
    )


class DefinitionValidation(serializers.Serializer):
    key = serializers.CharField()
    version = serializers.IntegerField()
    fingerprint = serializers.CharField(help_text="The fingerprint it would be published with.")
    published = serializers.ChoiceField(
        choices=["no", "identical", "conflict"],
        help_text="Whether this key and version is published already: 'no', 'identical' "
        "(publishing returns that row), or 'conflict' (publishing is refused: give it a "
        "new version).",
    )


class DefinitionRef(serializers.Serializer):
    key = serializers.CharField()
    version = serializers.IntegerField()
    fingerprint = serializers.CharField()


class Step(serializers.Serializer):
    id = serializers.IntegerField()
    node = serializers.CharField(help_text="The node's id in the definition.")
    type = serializers.CharField(help_text="The node type (action, timer, trigger, …).")
    title = serializers.CharField(allow_blank=True)
    ordinal = serializers.IntegerField()
    state = serializers.ChoiceField(choices=TokenState.choices)
    state_text = serializers.CharField(help_text="Where the step stands, in words.")
    waiting_for = serializers.CharField(allow_blank=True)
    attempt = serializers.IntegerField()
    not_before = serializers.DateTimeField(allow_null=True)
    reason = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class InstanceSummary(serializers.Serializer):
    id = serializers.IntegerField()
    url = serializers.CharField()
    definition = DefinitionRef()
    tenant = serializers.CharField()
    status = serializers.ChoiceField(choices=InstanceStatus.choices)
    status_text = serializers.CharField(help_text="Where the instance stands, in words.")
    reason = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    completed_at = serializers.DateTimeField(allow_null=True)


class LinkedRunDescriptor(serializers.Serializer):
    """A run another module carries out for a linked_run step, as GovFlow last saw it."""

    node = serializers.CharField(help_text="The linked_run node's id in the definition.")
    start_step = serializers.IntegerField(help_text="The step that started the run.")
    watch_step = serializers.IntegerField(help_text="The step that watches it.")
    module = serializers.CharField(help_text="The run provider (module) carrying it out.")
    run_reference = serializers.CharField(help_text="The run's reference in that module.")
    state = serializers.ChoiceField(
        choices=LinkedState.choices,
        help_text="What its last descriptor said; contradicted: a descriptor differed from "
        "the first conclusive one (an integrity incident).",
    )
    conclusive = serializers.BooleanField(
        help_text="A conclusive descriptor (succeeded or failed) is recorded; later looks "
        "are compared with it."
    )
    outputs = serializers.DictField(
        allow_null=True, help_text="The run's outputs, once it succeeded; else null."
    )
    reason_code = serializers.CharField(allow_blank=True, help_text="Why it failed, if it did.")
    looks = serializers.IntegerField(help_text="How many times GovFlow looked at it.")
    last_looked_at = serializers.DateTimeField(allow_null=True)
    started_at = serializers.DateTimeField()
    cancel_requested_at = serializers.DateTimeField(allow_null=True)


class InstanceDetail(InstanceSummary):
    variables = serializers.DictField()
    steps = Step(many=True)
    linked_runs = LinkedRunDescriptor(
        many=True, help_text="The runs its linked_run steps started in other modules."
    )


class HandoffDecision(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.CharField()
    state = serializers.CharField()
    requested_at = serializers.DateTimeField()
    result_fp = serializers.CharField(
        allow_blank=True,
        help_text="For effect confirmed: the BLAKE3 fingerprint of the result the decision "
        "carries (what the step returned, applied as its output when approved); '' otherwise.",
    )


class Handoff(serializers.Serializer):
    id = serializers.IntegerField(help_text="The step's id.")
    url = serializers.CharField()
    kind = serializers.ChoiceField(
        choices=["outcome_unknown", "pending_provider"],
        help_text="outcome_unknown: an operator must record what happened; "
        "pending_provider: the provider owns the outcome and is asked again.",
    )
    instance = serializers.IntegerField()
    instance_url = serializers.CharField()
    tenant = serializers.CharField()
    step = serializers.CharField(help_text="The node's id.")
    title = serializers.CharField(allow_blank=True)
    action = serializers.CharField(allow_blank=True)
    state_text = serializers.CharField()
    since = serializers.DateTimeField()
    next_poll_at = serializers.DateTimeField(allow_null=True)
    decision = HandoffDecision(
        allow_null=True,
        help_text="The decision awaiting a second person's approval, if one was requested.",
    )


class DeliveredTo(serializers.Serializer):
    instance = serializers.IntegerField()
    step = serializers.CharField()
    url = serializers.CharField()


class TriggerDelivery(serializers.Serializer):
    delivery_id = serializers.CharField()
    url = serializers.CharField()
    message = serializers.CharField()
    correlation = serializers.CharField()
    state = serializers.ChoiceField(
        choices=["received", "consumed"],
        help_text="received: kept until an instance waits for it; consumed: handed over.",
    )
    delivered_to = DeliveredTo(allow_null=True)
    received_at = serializers.DateTimeField()
    consumed_at = serializers.DateTimeField(allow_null=True)


class LedgerOperation(serializers.Serializer):
    key = serializers.CharField()
    step = serializers.CharField()
    action = serializers.CharField()
    recovery_mode = serializers.CharField()
    state = serializers.CharField()
    state_text = serializers.CharField()
    ordinal = serializers.IntegerField()
    fence = serializers.IntegerField()
    revision = serializers.IntegerField()
    chain_seq = serializers.IntegerField()
    definition_fp = serializers.CharField()
    input_fp = serializers.CharField()
    preview_fp = serializers.CharField()
    access_fp = serializers.CharField()
    idempotency_fp = serializers.CharField()
    result_fp = serializers.CharField(allow_blank=True)
    recorded_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class ChainCheckpoint(serializers.Serializer):
    seq = serializers.IntegerField()
    kind = serializers.CharField()
    fact = serializers.DictField(help_text="The fact: fingerprints, states, numbers and ids.")
    fact_fp = serializers.CharField()
    prev_link = serializers.CharField()
    link = serializers.CharField()
    key_id = serializers.CharField()
    projection_fp = serializers.CharField(allow_blank=True)
    recorded_at = serializers.DateTimeField()


class ChainVerification(serializers.Serializer):
    instance = serializers.IntegerField()
    ok = serializers.BooleanField()
    length = serializers.IntegerField(help_text="Checkpoints verified.")
    position = serializers.IntegerField(allow_null=True, help_text="The first broken one.")
    reason = serializers.CharField(allow_blank=True)
    projection_seq = serializers.IntegerField(
        help_text="The checkpoint whose projection fingerprint the stored rows were compared "
        "with (0: none)."
    )


class AuditExport(serializers.Serializer):
    instance = serializers.IntegerField()
    subject = serializers.CharField()
    exported_at = serializers.DateTimeField()
    verification = ChainVerification()
    checkpoints = ChainCheckpoint(many=True)


class Me(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["api_key", "session"])
    name = serializers.CharField()
    prefix = serializers.CharField(allow_null=True, help_text="The key's public id.")
    tenant = serializers.CharField(
        allow_null=True,
        help_text="The key's tenant; for a signed-in user, their only tenant, or null when "
        "they have several or none (see 'tenants').",
    )
    tenants = serializers.ListField(
        child=serializers.CharField(),
        allow_null=True,
        help_text="Every tenant this caller acts for, sorted; null: every tenant (a "
        "superuser). Empty: none, so every list is empty and nothing can be changed.",
    )
    scopes = serializers.ListField(child=serializers.CharField())
    expires_at = serializers.DateTimeField(allow_null=True)


class ProblemType(serializers.Serializer):
    type = serializers.CharField()
    code = serializers.CharField()
    status = serializers.IntegerField()
    title = serializers.CharField()
    description = serializers.CharField()
