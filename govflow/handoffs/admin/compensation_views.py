"""The instance page's compensations: what they are, where they stand, and their actions.

Start the compensations of an ended instance, request a compensation's run, approve
another person's request (bound to the revision and preview shown on this page), or
record what happened to one whose outcome is unknown. A mixin of
:class:`~govflow.handoffs.admin.instances.InstanceAdmin` (``get_instance``, ``act``,
``_post``) plus the reads the page shows (:func:`compensation_context`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

from govflow.engine.admin.base import pretty_json
from govflow.engine.compensable import CompensableEffect, compensation_input
from govflow.engine.models import Instance, InstanceStatus
from govflow.engine.registry import registry
from govflow.engine.selectors import instance_subject
from govflow.engine.services.definitions import trusted_spec
from govflow.engine.services.saga import DONE, PLANNED_FACT
from recovery.api import (
    CompensationView,
    DecisionKind,
    DecisionState,
    FingerprintKind,
    MultipleFileField,
    OperationState,
    compensations_of,
    decisions_of,
    facts_read,
    fingerprint_value,
    subject_revision,
)

from ..services.compensations import (
    compensation_approve_run,
    compensation_outcome_approve,
    compensation_outcome_request,
    compensation_request_run,
    compensations_start,
)
from .detail import APPROVE, OPERATE, REQUEST, missing_perms


class CompensationRequestForm(forms.Form):
    rationale = forms.CharField(
        label=_("Why it should run"),
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text=_("What you checked; a second person approves what the preview shows."),
    )


class CompensationOutcomeForm(forms.Form):
    kind = forms.ChoiceField(
        label=_("What happened"),
        choices=[
            (DecisionKind.EFFECT_CONFIRMED, _("The compensation happened (effect confirmed)")),
            (DecisionKind.EFFECT_ABSENT, _("It did not happen (effect absent)")),
        ],
        widget=forms.RadioSelect,
    )
    rationale = forms.CharField(
        label=_("Rationale"), max_length=4000, widget=forms.Textarea(attrs={"rows": 2})
    )
    evidence = MultipleFileField(label=_("Evidence files"), required=True)


@dataclass
class CompensationRow:
    view: CompensationView
    title: str
    preview: str = ""  # the compensating action's preview, as the approver reads it
    preview_fp: str = ""  # its fingerprint now (the approval is bound to it)
    next_in_line: bool = False
    open_decision: Any = None  # a "compensate" decision awaiting approval
    request_form: CompensationRequestForm | None = None
    outcome_form: CompensationOutcomeForm | None = None
    may_approve: bool = False
    missing: str = ""


def _preview(view: CompensationView) -> tuple[str, str]:
    """The compensation's preview as its provider shows it now, and its fingerprint."""
    effect = CompensableEffect.objects.filter(operation_key=view.original_key).first()
    original = registry.get(view.original_action)
    target = registry.get(view.action)
    if effect is None or original is None or original.compensate is None or target is None:
        return "", ""
    try:
        preview = target.preview(compensation_input(original.compensate, effect))
    except Exception:  # shown as missing; the dispatch refuses it with its reason
        return "", ""
    return pretty_json(preview), fingerprint_value(FingerprintKind.PREVIEW, preview)


def _rows(request, instance: Instance, views, bound) -> list[CompensationRow]:
    user = request.user
    titles = {
        nid: n.get("title") or nid for nid, n in trusted_spec(instance.definition).nodes.items()
    }
    subject = instance_subject(instance.pk)
    open_by_key = {
        d.operation.key: d
        for d in decisions_of(subject).filter(state=DecisionState.REQUESTED)
        if d.operation.key.startswith("cmp-")
    }
    first_open = next((v.key for v in views if v.state not in DONE), None)
    rows = []
    for view in views:
        row = CompensationRow(view, titles.get(view.step_id, view.step_id))
        row.preview, row.preview_fp = _preview(view)
        row.next_in_line = view.key == first_open
        row.open_decision = open_by_key.get(view.key)
        if row.open_decision is not None:
            row.may_approve = (
                row.open_decision.kind == DecisionKind.COMPENSATE
                and row.open_decision.requested_by_id != user.pk
                and user.has_perm(APPROVE)
            )
            row.missing = "" if row.may_approve else missing_perms(user, (APPROVE,))
        elif view.awaiting_approval and row.next_in_line:
            row.missing = missing_perms(user, (REQUEST,))
            if not row.missing:
                row.request_form = bound.get(("compensation", view.key)) or (
                    CompensationRequestForm(auto_id=f"id_cmp_{view.key[4:16]}_%s")
                )
        elif view.state == OperationState.OUTCOME_UNKNOWN:
            row.missing = missing_perms(user, (REQUEST,))
            if not row.missing:
                row.outcome_form = bound.get(("compensation_outcome", view.key)) or (
                    CompensationOutcomeForm(auto_id=f"id_cmpo_{view.key[4:16]}_%s")
                )
        rows.append(row)
    return rows


def compensation_context(request, instance: Instance, bound: dict | None) -> dict[str, Any]:
    """What the page's Compensations section shows (reads)."""
    subject = instance_subject(instance.pk)
    nodes = trusted_spec(instance.definition).nodes.values()
    declared = any("compensate_on" in node for node in nodes)
    if not declared:  # nothing to show: the page costs no query more
        return {"compensations_declared": False}
    views = compensations_of(subject)
    planned = facts_read(subject=subject, kind=PLANNED_FACT)
    ended = instance.status in (InstanceStatus.CANCELLED, InstanceStatus.FAILED)
    return {
        "compensations": _rows(request, instance, views, bound or {}),
        "compensations_declared": declared,
        "compensations_skipped": [item for fact in planned for item in fact.get("skipped", [])],
        "compensations_may_start": declared and ended and request.user.has_perm(OPERATE),
        "revision": subject_revision(subject),
    }


class CompensationActions:
    """Start, request, approve a compensation; record what happened to an unknown one."""

    URLS = (
        ("<int:instance_id>/compensations/start/", "compensations_start_view", "compensate"),
        (
            "<int:instance_id>/compensations/<str:key>/request/",
            "compensation_request_view",
            "cmp_request",
        ),
        (
            "<int:instance_id>/compensations/decisions/<int:decision_id>/approve/",
            "compensation_approve_view",
            "cmp_approve",
        ),
        (
            "<int:instance_id>/compensations/<str:key>/outcome/",
            "compensation_outcome_view",
            "cmp_outcome_request",
        ),
        (
            "<int:instance_id>/compensations/outcomes/<int:decision_id>/approve/",
            "compensation_outcome_approve_view",
            "cmp_outcome_approve",
        ),
    )

    def compensations_start_view(self, request, instance_id: int):
        instance = self.get_instance(request, instance_id, OPERATE)
        return self.act(
            request,
            instance,
            call=lambda: compensations_start(instance_id=instance.pk, actor=request.user),
            done=lambda keys: (
                f"{len(keys)} compensation(s) recorded; they run in reverse order, each as "
                "its policy says (automatically, or after two people approved it)."
            ),
        )

    def compensation_request_view(self, request, instance_id: int, key: str):
        instance = self.get_instance(request, instance_id, REQUEST)
        form = CompensationRequestForm(*self._post(request)[:1])
        return self.act(
            request,
            instance,
            form=form,
            slot=("compensation", key),
            call=lambda: compensation_request_run(
                instance_id=instance.pk,
                key=key,
                actor=request.user,
                rationale=form.cleaned_data["rationale"],
            ),
            done=lambda decision: (
                f"Running the compensation is requested (decision {decision.pk}); another "
                "person with the approve permission checks the preview and approves it."
            ),
        )

    def compensation_approve_view(self, request, instance_id: int, decision_id: int):
        instance = self.get_instance(request, instance_id, APPROVE)
        try:
            shown = int(request.POST.get("revision", ""))
        except ValueError:
            shown = -1
        return self.act(
            request,
            instance,
            call=lambda: compensation_approve_run(
                decision_id=decision_id,
                actor=request.user,
                instance_id=instance.pk,
                shown_revision=shown,
                shown_preview_fp=request.POST.get("preview_fp", ""),
            ),
            done=lambda approved: (
                f"Decision {approved.pk} is approved: the compensation runs next, as long as "
                "nothing changes before it is dispatched."
            ),
        )

    def compensation_outcome_view(self, request, instance_id: int, key: str):
        instance = self.get_instance(request, instance_id, REQUEST)
        form = CompensationOutcomeForm(*self._post(request))
        return self.act(
            request,
            instance,
            form=form,
            slot=("compensation_outcome", key),
            call=lambda: compensation_outcome_request(
                instance_id=instance.pk,
                key=key,
                kind=form.cleaned_data["kind"],
                rationale=form.cleaned_data["rationale"],
                evidence=form.cleaned_data["evidence"],
                actor=request.user,
            ),
            done=lambda decision: (
                f"Decision {decision.pk} is requested; a second person approves it in "
                "Decisions below."
            ),
        )

    def compensation_outcome_approve_view(self, request, instance_id: int, decision_id: int):
        instance = self.get_instance(request, instance_id, APPROVE)
        return self.act(
            request,
            instance,
            call=lambda: compensation_outcome_approve(
                decision_id=decision_id, actor=request.user, instance_id=instance.pk
            ),
            done=lambda approved: (
                f"Decision {approved.pk} ({approved.get_kind_display()}) is approved; the "
                "remaining compensations go on if it happened."
            ),
        )
