"""The POST actions on an instance: cancel, retry, approve, decide or withdraw, resolve.

A mixin of :class:`~govflow.handoffs.admin.instances.InstanceAdmin`, which supplies
``get_instance``, ``act`` (validate, call one service, report, redirect) and ``_post``.
"""

from __future__ import annotations

from django.http import Http404
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop, ngettext

from govflow.engine.linked import step_action
from govflow.engine.models import Instance, InstanceStatus, Token
from govflow.engine.selectors import (
    dead_task_of,
    engine_incidents_of,
    instance_subject,
    node_of,
    step_get,
)
from govflow.engine.services.external_results import task_retry
from govflow.engine.services.instances import instance_cancel, step_retry
from govflow.engine.services.reconcile import Asked
from recovery.api import DecisionKind, decision_get

from ..forms import (
    ApprovalForm,
    CancelForm,
    IncidentResolveForm,
    RejectDecisionForm,
)
from ..services.desk import (
    approval_decide,
    handoff_approve,
    handoff_ask_provider,
    handoff_reject,
    handoff_request,
    handoff_withdraw,
)
from ..services.incidents import RESOLVE, engine_incident_resolve, open_cases_of
from ..words import node_title
from .detail import APPROVE, OPERATE, REQUEST, handoff_form


def decided_words(decision: str, title: str) -> str:
    """What the approver reads after deciding: "You approved 'Permits officer decides'."."""
    if decision == "approve":
        return _("You approved '%(step)s'; it is recorded.") % {"step": title}
    return _("You rejected '%(step)s'; it is recorded.") % {"step": title}


def approved_message(approved, *, was_cancelled: bool = False) -> str:
    """What an approval did, as the operator who approved it reads it."""
    step = approved.operation.step_id
    if was_cancelled and approved.kind == DecisionKind.EFFECT_CONFIRMED:
        what = _("step '%(step)s' is recorded as completed; the instance stays cancelled")
    elif was_cancelled:
        what = _("step '%(step)s' is recorded as failed; the instance stays cancelled")
    elif approved.kind == DecisionKind.EFFECT_CONFIRMED:
        what = _(
            "step '%(step)s' is completed with the confirmed result, applied as its output, "
            "and the instance goes on from there"
        )
    elif approved.kind == DecisionKind.EFFECT_ABSENT:
        what = _(
            "step '%(step)s' is marked failed and the instance is blocked: retry the step "
            "(the provider gets the same idempotency key) or cancel the instance"
        )
    else:
        what = _("the instance is cancelled; nothing outside the engine was undone")
    return _("Decision %(pk)s (%(kind)s) is approved: %(what)s.") % {
        "pk": approved.pk,
        "kind": approved.get_kind_display(),
        "what": what % {"step": step} if "%(step)s" in what else what,
    }


class StepActions:
    """Cancel an instance; retry, approve or ask a decision on a step; decide a decision."""

    URLS = (
        ("<int:instance_id>/cancel/", "cancel_view", "cancel"),
        ("<int:instance_id>/steps/<int:token_id>/retry/", "retry_view", "retry"),
        ("<int:instance_id>/steps/<int:token_id>/approval/", "approval_view", "approval"),
        ("<int:instance_id>/steps/<int:token_id>/handoff/", "handoff_view", "handoff"),
        ("<int:instance_id>/steps/<int:token_id>/reconcile/", "reconcile_view", "reconcile"),
        (
            "<int:instance_id>/decisions/<int:decision_id>/approve/",
            "decision_approve_view",
            "decision_approve",
        ),
        (
            "<int:instance_id>/decisions/<int:decision_id>/reject/",
            "decision_reject_view",
            "decision_reject",
        ),
        (
            "<int:instance_id>/decisions/<int:decision_id>/withdraw/",
            "decision_withdraw_view",
            "decision_withdraw",
        ),
        (
            "<int:instance_id>/incidents/<int:incident_id>/resolve/",
            "incident_resolve_view",
            "incident_resolve",
        ),
    )

    def _token(self, instance: Instance, token_id: int) -> Token:
        token = step_get(instance_id=instance.pk, token_id=token_id)
        if token is None:
            raise Http404(f"Instance {instance.pk} has no step {token_id}.")
        return token

    def _decision(self, instance: Instance, decision_id: int):
        decision = decision_get(decision_id=decision_id, subject=instance_subject(instance.pk))
        if decision is None:
            raise Http404(f"Instance {instance.pk} has no decision {decision_id}.")
        return decision

    def cancel_view(self, request, instance_id: int):
        instance = self.get_instance(request, instance_id, OPERATE)
        form = CancelForm(request.POST if request.method == "POST" else None)
        return self.act(
            request,
            instance,
            form=form,
            slot="cancel",
            call=lambda: instance_cancel(
                instance_id=instance.pk, actor=request.user, reason=form.cleaned_data["reason"]
            ),
            done=lambda cancelled: " ".join(
                filter(
                    None,
                    [
                        _("Instance %(pk)s is cancelled.") % {"pk": instance.pk},
                        open_cases_of(cancelled).summary(),
                    ],
                )
            ),
        )

    def retry_view(self, request, instance_id: int, token_id: int):
        instance = self.get_instance(request, instance_id, OPERATE)
        token = self._token(instance, token_id)
        dead = dead_task_of(token)
        if dead is not None:  # an external task's step: a new task, for a worker to fetch
            return self.act(
                request,
                instance,
                call=lambda: task_retry(task_id=dead.pk, actor=request.user),
                done=lambda fresh: (
                    _("Step '%(step)s' waits for a new task (%(task)s).")
                    % {"step": token.node_id, "task": fresh.pk}
                ),
            )
        return self.act(
            request,
            instance,
            call=lambda: step_retry(instance_id=instance.pk, token_id=token.pk, actor=request.user),
            done=lambda result: (
                _("Step '%(step)s' will be retried (attempt %(attempt)s).")
                % {"step": token.node_id, "attempt": token.attempt + 1}
            ),
        )

    def approval_view(self, request, instance_id: int, token_id: int):
        # The node names its own permission; approval_decide checks it and says which.
        instance = self.get_instance(request, instance_id)
        token = self._token(instance, token_id)
        form = ApprovalForm(
            request.POST if request.method == "POST" else None, auto_id=f"id_approval_{token.pk}_%s"
        )
        return self.act(
            request,
            instance,
            form=form,
            slot=("approval", token.pk),
            call=lambda: approval_decide(
                instance_id=instance.pk,
                token_id=token.pk,
                actor=request.user,
                approved=form.cleaned_data["decision"] == "approve",
                note=form.cleaned_data["note"],
            ),
            done=lambda _: decided_words(
                form.cleaned_data["decision"], node_title(node_of(instance, token), token.node_id)
            ),
        )

    def handoff_view(self, request, instance_id: int, token_id: int, initial_result=None):
        """Request a decision; ``initial_result`` pre-fills the result fields (e.g. with
        what the provider's reconcile found)."""
        instance = self.get_instance(request, instance_id, OPERATE, REQUEST)
        token = self._token(instance, token_id)
        node = node_of(instance, token)
        form = handoff_form(
            instance,
            token,
            node,
            step_action(node),
            *self._post(request),
            initial_result=initial_result,
        )
        return self.act(
            request,
            instance,
            form=form,
            slot=("handoff", token.pk),
            call=lambda: handoff_request(
                instance_id=instance.pk,
                token_id=token.pk,
                actor=request.user,
                kind=form.cleaned_data["kind"],
                rationale=form.cleaned_data["rationale"],
                evidence=form.cleaned_data["evidence"],
                checks=form.check_answers(),
                result=form.result(),
            ),
            done=lambda decision: (
                _(
                    "Decision %(pk)s (%(kind)s) is requested. "
                    "Another person with the approve permission must check it and approve it."
                )
                % {"pk": decision.pk, "kind": decision.get_kind_display()}
            ),
        )

    def reconcile_view(self, request, instance_id: int, token_id: int):
        """ "Ask the provider now": its reconcile and automatic checks, kept as evidence."""
        instance = self.get_instance(request, instance_id, OPERATE)
        token = self._token(instance, token_id)
        return self.act(
            request,
            instance,
            call=lambda: handoff_ask_provider(
                instance_id=instance.pk, token_id=token.pk, actor=request.user
            ),
            done=lambda asked: _asked_message(token.node_id, asked),
        )

    def decision_approve_view(self, request, instance_id: int, decision_id: int):
        instance = self.get_instance(request, instance_id, APPROVE)
        decision = self._decision(instance, decision_id)
        return self.act(
            request,
            instance,
            # The fingerprint of the result the approver was shown; a post without one
            # approves nothing that carries a result.
            call=lambda: handoff_approve(
                decision_id=decision.pk,
                actor=request.user,
                result_fp=request.POST.get("result_fp") or None,
            ),
            done=lambda approved: approved_message(
                approved, was_cancelled=instance.status == InstanceStatus.CANCELLED
            ),
        )

    def decision_withdraw_view(self, request, instance_id: int, decision_id: int):
        instance = self.get_instance(request, instance_id, REQUEST)
        decision = self._decision(instance, decision_id)
        return self.act(
            request,
            instance,
            call=lambda: handoff_withdraw(decision_id=decision.pk, actor=request.user),
            done=lambda result: (
                _(
                    "Decision %(pk)s is withdrawn; the step still waits for a decision, "
                    "and you can request a new one."
                )
                % {"pk": decision.pk}
            ),
        )

    def incident_resolve_view(self, request, instance_id: int, incident_id: int):
        instance = self.get_instance(request, instance_id, RESOLVE)
        incident = engine_incidents_of(instance).filter(pk=incident_id).first()
        if incident is None:
            raise Http404(f"Instance {instance.pk} has no engine incident {incident_id}.")
        form = IncidentResolveForm(*self._post(request), auto_id=f"id_incident_{incident.pk}_%s")
        return self.act(
            request,
            instance,
            form=form,
            slot=("incident", incident.pk),
            call=lambda: engine_incident_resolve(
                incident_id=incident.pk,
                actor=request.user,
                rationale=form.cleaned_data["rationale"],
                evidence=form.cleaned_data["evidence"],
            ),
            done=lambda result: (
                _("Engine incident %(pk)s is resolved; your investigation is recorded.")
                % {"pk": incident.pk}
            ),
        )

    def decision_reject_view(self, request, instance_id: int, decision_id: int):
        instance = self.get_instance(request, instance_id, APPROVE)
        decision = self._decision(instance, decision_id)
        form = RejectDecisionForm(
            request.POST if request.method == "POST" else None,
            auto_id=f"id_reject_{decision.pk}_%s",
        )
        return self.act(
            request,
            instance,
            form=form,
            slot=("reject", decision.pk),
            call=lambda: handoff_reject(
                decision_id=decision.pk, actor=request.user, note=form.cleaned_data["note"]
            ),
            done=lambda result: (
                _("Decision %(pk)s is rejected; the step still waits for a decision.")
                % {"pk": decision.pk}
            ),
        )


ANSWERED = {
    "succeeded": gettext_noop("The provider says the effect happened"),
    "failed": gettext_noop("The provider says the effect did not happen"),
    "pending": gettext_noop("The provider is still working on it"),
    "unknown": gettext_noop("The provider cannot say whether the effect happened"),
}


def _asked_message(node_id: str, asked: Asked) -> str:
    """What an operator reads after asking a provider about step ``node_id``."""
    if not asked.outcome:
        said = _("The provider has no reconcile hook")
    else:
        said = _(ANSWERED.get(asked.outcome, gettext_noop("The provider answered")))
    checks = (
        ngettext(
            "; %(n)s automatic check finding recorded",
            "; %(n)s automatic check findings recorded",
            asked.checks,
        )
        % {"n": asked.checks}
        if asked.checks
        else ""
    )
    if asked.settled:
        follows = _("Its action lets its word settle the step, so the step moved on.")
    elif asked.outcome in ("succeeded", "failed"):
        follows = _(
            "The request form below is pre-filled from it: check it, add evidence and "
            "request the decision; a second person approves it."
        )
    else:
        follows = _("The decision stays with an operator.")
    return _("Asked about step '%(step)s'. %(said)s%(checks)s. %(follows)s") % {
        "step": node_id,
        "said": said,
        "checks": checks,
        "follows": follows,
    }
