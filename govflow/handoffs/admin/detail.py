"""What an instance's page shows: reads only, gathered for the template.

Forms an operator submitted with errors are passed back in ``bound`` so the page shows
them in place (keyed ``"cancel"``, ``("approval", token id)``, ``("handoff", token id)``,
``("reject", decision id)``, ``("incident", engine incident id)``, ``("migrate", action
name)`` or ``("migration_reject", migration id)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.urls import reverse
from django.utils.translation import gettext as _

from govflow.engine.admin.base import pretty_json
from govflow.engine.linked import step_action
from govflow.engine.models import (
    Incident,
    Instance,
    InstanceStatus,
    Token,
    TokenState,
    WaitKind,
)
from govflow.engine.outputs import result_fields
from govflow.engine.registry import ActionDefinition
from govflow.engine.selectors import (
    engine_incidents_of,
    external_tasks_of,
    instance_is_active,
    instance_steps,
    instance_subject,
)
from govflow.engine.services.definitions import trusted_spec
from recovery.api import (
    INLINE_TYPES,
    DecisionKind,
    DecisionState,
    IncidentStatus,
    ObservationKind,
    OperationState,
    RecoveryError,
    chain_verify,
    decision_evidence,
    decisions_of,
    evidence_files,
    incidents_of,
    observations_of,
    operations_of,
    provider_findings,
)

from ..case import HandoffCase, handoff_case
from ..forms import (
    ApprovalForm,
    CancelForm,
    HandoffRequestForm,
    IncidentResolveForm,
    RejectDecisionForm,
)
from ..graph import definition_svg, node_states
from ..present import MAX_ROWS, Times, choice_labels, flatten, node_titles
from ..services.desk import result_schema_of
from ..services.incidents import RESOLVE, open_cases_in
from ..timeline import instance_timeline, timeline_page
from ..words import case_labels, node_title, permission_name
from .detail_contracts import contract_context

OPERATE = "engine.operate_instance"
REQUEST = "recovery.request_decision"
APPROVE = "recovery.approve_decision"
VIEW_INTEGRITY = "recovery.view_integrityincident"
TRAIL = "recovery.view_checkpoint"  # the audit trail holds every checkpoint
# step_retry refuses the steps of these instances; the page offers no retry there.
NOT_RETRIED = (InstanceStatus.CANCELLED, InstanceStatus.COMPLETED)


def evidence_url(evidence) -> str:
    """The permission-checked view that streams an evidence file (never a media URL)."""
    return reverse("admin:recovery_decision_evidence", args=[evidence.pk])


@dataclass
class StepRow:
    token: Token
    node_type: str
    action: ActionDefinition | None
    title: str = ""  # the node's title from the definition (its id when it has none)
    state: str = ""  # the token's state, wait and not-before time in words (read once per
    waits_for: str = ""  # page, not per row in the template)
    not_before: str = ""
    retry: bool = False
    approval_permission: str = ""
    approval_permission_name: str = ""
    approval_form: ApprovalForm | None = None
    handoff_form: HandoffRequestForm | None = None
    open_decision: Any = None  # a recovery decision awaiting approval
    missing: str = ""  # the permissions this user lacks to act here, said on the page
    findings: list = field(default_factory=list)  # what the provider's reconcile/checks said
    may_ask: bool = False  # "Ask the provider now"
    prefilled: bool = False  # the request form starts from the provider's finding
    case: HandoffCase | None = None  # what an operator deciding an unknown outcome reads


@dataclass
class DecisionRow:
    decision: Any  # a recovery decision, as recovery.api.decisions_of reads it
    evidence: list = field(default_factory=list)  # (file, the checked view's URL)
    reject_form: RejectDecisionForm | None = None
    own: bool = False  # the user requested it: they may withdraw it, never decide it
    missing: str = ""  # why this user may not decide it
    result: list = field(default_factory=list)  # ResultRow: the values approved with it


def missing_perms(user, perms) -> str:
    """The permissions of ``perms`` that ``user`` lacks, as the page names them."""
    return ", ".join(f"'{p}'" for p in perms if not user.has_perm(p))


def _step_rows(request, instance: Instance, tokens, open_by_key, bound, ops, late) -> list[StepRow]:
    user = request.user
    nodes = trusted_spec(instance.definition).nodes
    states, waits, times = choice_labels(TokenState), choice_labels(WaitKind), Times()
    rows = []
    for token in tokens:
        node = dict(nodes.get(token.node_id, {}))
        action = step_action(node) if node.get("type") in ("action", "linked_run") else None
        row = StepRow(
            token=token,
            node_type=node.get("type", "?"),
            action=action,
            title=node_title(node, token.node_id),
            state=states.get(token.state, token.state),
            waits_for=waits.get(token.wait_kind, token.wait_kind or ""),
            not_before=times.format(token.not_before),
        )
        if token.state == TokenState.FAILED and instance.status not in NOT_RETRIED:
            row.retry = user.has_perm(OPERATE)
            row.missing = missing_perms(user, (OPERATE,))
        if token.state == TokenState.WAITING and token.wait_kind == WaitKind.APPROVAL:
            row.approval_permission = node.get("permission", "")
            row.approval_permission_name = permission_name(row.approval_permission)
            row.approval_form = bound.get(("approval", token.pk))
            if row.approval_form is None and user.has_perm(row.approval_permission):
                row.approval_form = ApprovalForm(auto_id=f"id_approval_{token.pk}_%s")
        if token.state == TokenState.OUTCOME_UNKNOWN:
            row.case = handoff_case(instance, token, node, action, ops, late)
            _uncertain_row(row, instance, node, user, open_by_key, bound)
        rows.append(row)
    return rows


def handoff_form(
    instance: Instance,
    token: Token,
    node,
    action,
    data=None,
    files=None,
    *,
    initial=None,
    initial_result=None,
) -> HandoffRequestForm:
    """The form asking for a decision on ``token``: the action's checks, and the step's
    result fields typed by its output schema, pre-filled with ``initial`` (kind and
    rationale) and ``initial_result`` (what the provider's reconcile found). A cancelled
    instance takes no cancel."""
    return HandoffRequestForm(
        data,
        files,
        initial=initial,
        checks=action.checks if action else (),
        allow_cancel=instance.status != InstanceStatus.CANCELLED,
        result_fields=result_fields(result_schema_of(action, node)),
        initial_result=initial_result,
        auto_id=f"id_handoff_{token.pk}_%s",
    )


@dataclass
class ResultRow:
    """One value of a decision's result, labelled as the step's output schema labels it."""

    name: str
    label: str
    value: str


def result_rows(decision, schema) -> list[ResultRow]:
    if decision.result is None:
        return []
    labels = {f.name: f.label for f in result_fields(schema)}
    return [
        ResultRow(
            name, labels.get(name, name), value if isinstance(value, str) else pretty_json(value)
        )
        for name, value in decision.result.items()
    ]


def _uncertain_row(row: StepRow, instance: Instance, node, user, open_by_key, bound) -> None:
    """An uncertain step: its open decision, what its provider said, the request form
    (pre-filled from a conclusive finding of the provider's reconcile)."""
    token, action = row.token, row.action
    row.open_decision = open_by_key.get(token.operation_key)
    row.findings = provider_findings(token.operation_key)
    row.may_ask = bool(action and action.asks_provider and user.has_perm(OPERATE))
    if row.open_decision is None and user.has_perms((OPERATE, REQUEST)):
        initial = finding_initial(row.findings)
        row.prefilled = bool(initial)
        row.handoff_form = bound.get(("handoff", token.pk)) or handoff_form(
            instance,
            token,
            node,
            action,
            initial=initial,
            initial_result=finding_result(row.findings),
        )
    elif row.open_decision is None:
        row.missing = missing_perms(user, (OPERATE, REQUEST))


def _conclusive(findings):
    """The newest conclusive answer of the provider's reconcile among ``findings``."""
    return next(
        (
            f
            for f in findings
            if f.kind == ObservationKind.RECONCILE and f.outcome in ("succeeded", "failed")
        ),
        None,
    )


def finding_result(findings) -> dict[str, Any] | None:
    """The step's result as the provider's reconcile found it (the request form's result
    fields start from it), or None when it found no effect."""
    found = _conclusive(findings)
    return dict(found.values) if found is not None and found.outcome == "succeeded" else None


def finding_initial(findings) -> dict[str, Any]:
    """The request form's initial values from the newest conclusive reconcile finding.

    The operator still reads it, attaches evidence and submits; a second person approves.
    """
    found = _conclusive(findings)
    if found is None:
        return {}
    confirmed = found.outcome == "succeeded"
    values = ", ".join(f"{k}={v}" for k, v in sorted(found.values.items()))
    said = (
        _("returned %(values)s") % {"values": values}
        if confirmed
        else _("said: %(reason)s") % {"reason": found.reason or _("the effect did not happen")}
    )
    rationale = _(
        "The provider's reconcile (finding %(pk)s, %(at)s UTC) looked the effect up by this "
        "step's idempotency key and %(said)s."
    ) % {"pk": found.pk, "at": f"{found.observed_at:%Y-%m-%d %H:%M}", "said": said}
    return {
        "kind": DecisionKind.EFFECT_CONFIRMED if confirmed else DecisionKind.EFFECT_ABSENT,
        "rationale": rationale,
    }


def _decision_rows(request, instance: Instance, decisions, bound) -> list[DecisionRow]:
    user = request.user
    nodes = trusted_spec(instance.definition).nodes
    rows = []
    for decision in decisions:
        node = nodes.get(decision.operation.step_id, {})
        schema = result_schema_of(step_action(node), node)
        row = DecisionRow(
            decision=decision,
            evidence=[(f, evidence_url(f)) for f in decision_evidence(decision)],
            result=result_rows(decision, schema),
        )
        if decision.state == DecisionState.REQUESTED:
            row.own = decision.requested_by_id == user.pk
            row.missing = missing_perms(user, (APPROVE,))
            if not row.own and not row.missing:
                row.reject_form = bound.get(("reject", decision.pk)) or RejectDecisionForm(
                    auto_id=f"id_reject_{decision.pk}_%s"
                )
        rows.append(row)
    return rows


@dataclass
class IncidentRow:
    incident: Incident
    evidence: list = field(default_factory=list)  # (file, the checked view's URL)
    resolve_form: IncidentResolveForm | None = None


def _engine_incident_rows(request, incidents: list[Incident], bound) -> list[IncidentRow]:
    may_resolve = request.user.has_perm(RESOLVE)
    files = {
        f.pk: f for f in evidence_files(ids=[i for x in incidents for i in x.resolution_evidence])
    }
    rows = []
    for incident in incidents:
        row = IncidentRow(incident)
        row.evidence = [
            (files[i], evidence_url(files[i])) for i in incident.resolution_evidence if i in files
        ]
        if incident.resolved_at is None and may_resolve:
            row.resolve_form = bound.get(("incident", incident.pk)) or IncidentResolveForm(
                auto_id=f"id_incident_{incident.pk}_%s"
            )
        rows.append(row)
    return rows


def _verification(subject) -> dict[str, Any]:
    try:
        return {"verification": chain_verify(subject), "verify_error": ""}
    except RecoveryError as exc:  # e.g. chain keys missing from settings
        return {"verification": None, "verify_error": str(exc)}


def _in_words(operations, titles: dict[str, str]) -> None:
    """The ledger table's step titles, states and times, once here (not per row in the
    template)."""
    states, times = choice_labels(OperationState), Times()
    for op in operations:
        op.step_title = titles.get(op.step_id, op.step_id)
        op.state_words = states.get(op.state, op.state)
        op.recorded = times.format(op.recorded_at)


def detail_context(request, instance: Instance, bound: dict | None = None) -> dict[str, Any]:
    bound = bound or {}
    user = request.user
    subject = instance_subject(instance.pk)
    tokens = list(instance_steps(instance))
    operations = list(operations_of(subject))
    decisions = list(decisions_of(subject))
    open_by_key = {d.operation.key: d for d in decisions if d.state == DecisionState.REQUESTED}
    active = instance_is_active(instance)
    integrity = list(incidents_of(subject))
    engine_incidents = list(engine_incidents_of(instance).select_related("resolved_by"))
    late = list(observations_of(subject, kind=ObservationKind.LATE))
    spec = trusted_spec(instance.definition)
    titles = node_titles(spec)
    _in_words(operations, titles)
    # Rationales and evidence are the recovery desk's records: shown to its users only.
    see_decisions = any(user.has_perm(p) for p in ("recovery.view_decision", REQUEST, APPROVE))
    return {
        "instance": instance,
        "subject": subject,
        "variables_json": pretty_json(instance.variables),
        "variables": flatten(instance.variables),
        "variables_max": MAX_ROWS,
        "titles": titles,
        "timeline": timeline_page(
            instance_timeline(
                instance, tokens, titles, subject, operations, integrity, engine_incidents
            ),
            earlier=True,
        ),
        "graph": definition_svg(spec, titles, node_states(tokens)),
        "steps": _step_rows(request, instance, tokens, open_by_key, bound, operations, late),
        "operations": operations,
        "late_answers": late,
        "decisions": _decision_rows(request, instance, decisions, bound) if see_decisions else [],
        "see_decisions": see_decisions,
        **_verification(subject),
        "engine_incidents": _engine_incident_rows(request, engine_incidents, bound),
        "resolve_permission": RESOLVE,
        "open_cases": None if active else open_cases_in(tokens, engine_incidents, integrity),
        "external_tasks": external_tasks_of(instance),
        "linked_runs": list(instance.linked_runs.order_by("pk")),
        "integrity_incidents": integrity,
        "blocking_incident": next((i for i in integrity if i.status == IncidentStatus.OPEN), None),
        "see_integrity_incidents": user.has_perm(VIEW_INTEGRITY),
        "cancel_form": (bound.get("cancel") or CancelForm())
        if (active and user.has_perm(OPERATE))
        else None,
        "cancel_missing": missing_perms(user, (OPERATE,)) if active else "",
        "approve_permission": APPROVE,
        "inline_types": INLINE_TYPES,
        "case_rows": [
            (label, instance.case_map[name])
            for name, label in case_labels(instance.definition).items()
            if name in instance.case_map
        ],
        "may_export_trail": user.has_perm(TRAIL),
        **contract_context(request, instance, active, bound),
    }
