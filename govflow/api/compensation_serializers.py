"""The shapes of ``/api/v1/instances/<id>/compensations/`` (see ``views/compensations``)."""

from __future__ import annotations

from rest_framework import serializers

from .request_shape import RequestShape


class CompensationStartRequest(RequestShape):
    """No fields: the definition says which steps are compensated, and how."""


class CompensationOriginal(serializers.Serializer):
    operation_key = serializers.CharField(help_text="The original step's ledger operation.")
    step = serializers.CharField(help_text="The original step's node id.")
    step_title = serializers.CharField(help_text="Its title in the definition.")
    action = serializers.CharField(help_text="The action whose effect is undone.")


class CompensationDecision(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.CharField(
        help_text="compensate (run it), effect_confirmed or effect_absent (what happened "
        "to one of unknown outcome)."
    )
    requested_by = serializers.CharField()
    requested_at = serializers.DateTimeField()


class Compensation(serializers.Serializer):
    order = serializers.IntegerField(help_text="1 runs first (the reverse of the originals).")
    key = serializers.CharField(help_text="Its own cmp- operation key (the provider's reference).")
    undoes = CompensationOriginal()
    action = serializers.CharField(help_text="The compensating action.")
    state = serializers.ChoiceField(
        choices=[
            "prepared",
            "dispatched",
            "pending",
            "succeeded",
            "failed",
            "outcome_unknown",
            "effect_confirmed",
            "effect_absent",
        ],
        help_text="Its ledger operation's state.",
    )
    state_text = serializers.CharField(help_text="Where it stands and what happens next.")
    trigger = serializers.ChoiceField(
        choices=["cancel", "failure", "operator"], help_text="Why it was recorded."
    )
    approval = serializers.ChoiceField(
        choices=["automatic", "operator"],
        help_text="automatic: it runs by itself; operator: one person requests it on the "
        "desk and a second approves it.",
    )
    awaiting_approval = serializers.BooleanField()
    approved = serializers.BooleanField(help_text="An approval is bound to it now.")
    open_decision = CompensationDecision(
        allow_null=True, help_text="A request awaiting a second person's approval, if any."
    )
    input_fp = serializers.CharField()
    preview_fp = serializers.CharField()
    idempotency_fp = serializers.CharField()


class CompensationList(serializers.Serializer):
    instance = serializers.IntegerField()
    desk_url = serializers.URLField(
        help_text="The instance's page on the desk, where compensations are approved."
    )
    compensations = Compensation(many=True)
