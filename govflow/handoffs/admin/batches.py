"""Bulk triage pages: select uncertain steps of one kind, preview, submit, approve whole.

Thin views on :mod:`govflow.handoffs.batches` (reads) and
:mod:`govflow.handoffs.services.batches` (writes), ADR 0024. The pages are the
``DecisionBatch`` model admin's: its list, ``new/`` (select), ``preview/`` and ``submit/``
(POST), a batch's page (its change view) and its ``approve/`` and ``reject/`` (POST).
"""

from __future__ import annotations

from collections import Counter

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.translation import gettext as _

from govflow.engine.admin.base import ReadOnlyAdmin, require
from govflow.engine.errors import EngineError
from govflow.engine.registry import registry
from govflow.engine.tenancy import scope
from recovery.api import (
    RecoveryError,
    decision_evidence,
    operation_keys_of_action,
    operations_standing,
)

from ..batch_forms import BatchTermsForm
from ..batches import BatchRefused, batch_preview, uncertain_steps
from ..forms import RejectDecisionForm, evidence_help
from ..models import BatchState, DecisionBatch
from ..services.batches import BatchSubmission, batch_approve, batch_reject, batch_request

OPERATE = "engine.operate_instance"
REQUEST = "recovery.request_decision"
APPROVE = "recovery.approve_decision"
REFUSALS = (BatchRefused, EngineError, RecoveryError)


@admin.register(DecisionBatch)
class DecisionBatchAdmin(ReadOnlyAdmin):
    list_display = ("id", "action", "kind", "tenant", "state", "requested_by", "requested_at")
    list_filter = ("state", "kind", "tenant")
    list_select_related = ("requested_by",)
    ordering = ("-requested_at", "-pk")

    def get_queryset(self, request):
        """Only the batches of the user's tenants: another tenant's is not found (404)."""
        return scope(super().get_queryset(request), request.user)

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm("engine.view_instance")

    def get_urls(self):
        def url(route: str, view, name: str):
            return path(
                route, self.admin_site.admin_view(view), name=f"handoffs_decisionbatch_{name}"
            )

        return [
            url("new/", self.select_view, "select"),
            url("preview/", self.preview_view, "preview"),
            url("submit/", self.submit_view, "submit"),
            url("<int:object_id>/approve/", self.approve_view, "approve"),
            url("<int:object_id>/reject/", self.reject_view, "reject"),
            *super().get_urls(),
        ]

    def render(self, request, template: str, title: str, **context):
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            **context,
        }
        return TemplateResponse(request, f"admin/handoffs/decisionbatch/{template}", context)

    # -- select and preview ---------------------------------------------------------------

    def select_view(self, request, form=None):
        """The user's uncertain steps of one action to select; without an action, the kinds
        (action, workflow, tenant) there are, each a link."""
        require(request, OPERATE, REQUEST)
        query = form.data if form is not None else request.GET
        action = query.get("action") or ""
        steps = uncertain_steps(request.user)
        rows, groups = [], []
        if action:
            rows = list(steps.filter(operation_key__in=operation_keys_of_action(action)))
            for name in ("definition", "tenant"):
                wanted = request.GET.get(name)
                if wanted:
                    rows = [t for t in rows if str(_attr(t, name)) == wanted]
        else:
            groups = _groups(steps)
        action_def = registry.get(action) if action else None
        if form is None and action:
            form = BatchTermsForm(initial={"action": action}, checks=_checks(action_def))
        chosen = set(query.getlist("steps")) if form is not None and form.is_bound else set()
        return self.render(
            request,
            "select.html",
            _("Bulk triage of unknown outcomes"),
            action=action,
            action_title=getattr(action_def, "title", "") or action,
            groups=groups,
            rows=rows,
            chosen=chosen,
            form=form,
        )

    def preview_view(self, request):
        require(request, OPERATE, REQUEST)
        if request.method != "POST":
            return redirect(reverse("admin:handoffs_decisionbatch_select"))
        action = request.POST.get("action", "")
        form = BatchTermsForm(request.POST, checks=_checks(registry.get(action)))
        if not form.is_valid():
            return self.select_view(request, form)
        return self._preview_again(request, form)

    def render_preview(self, request, preview, form):
        return self.render(
            request,
            "preview.html",
            _("Preview: %(kind)s on %(n)s step(s)")
            % {"kind": preview.kind_label, "n": len(preview.rows)},
            preview=preview,
            form=form,
            check_answers=[
                (form.fields["check_" + cid].label, answer)
                for cid, answer in preview.checks.items()
            ],
            evidence_help=evidence_help(),
        )

    # -- submit ---------------------------------------------------------------------------

    def submit_view(self, request):
        require(request, OPERATE, REQUEST)
        if request.method != "POST":
            return redirect(reverse("admin:handoffs_decisionbatch_select"))
        action = request.POST.get("action", "")
        form = BatchTermsForm(request.POST, checks=_checks(registry.get(action)))
        if not form.is_valid():
            return self.select_view(request, form)
        steps = form.cleaned_data["steps"]
        try:
            batch = batch_request(
                submission=BatchSubmission(
                    token_ids=steps,
                    kind=form.cleaned_data["kind"],
                    rationale=form.cleaned_data["rationale"],
                    checks=form.check_answers(),
                    fingerprint=request.POST.get("fingerprint", ""),
                    previewed=_previewed(request.POST.getlist("previewed")),
                    references={s: request.POST.get(f"reference_{s}", "") for s in steps},
                    files={s: request.FILES.getlist(f"evidence_{s}") for s in steps},
                    shared=request.FILES.getlist("shared"),
                ),
                actor=request.user,
            )
        except REFUSALS as exc:
            messages.error(request, str(exc))
            return self._preview_again(request, form)
        messages.success(
            request,
            _(
                "Batch %(id)s is requested: %(n)s decision(s) (%(kind)s). A second person "
                "with the approve permission checks the evidence and approves or rejects "
                "the batch as a whole."
            )
            % {"id": batch.pk, "n": len(steps), "kind": form.kind_label()},
        )
        return redirect(reverse("admin:handoffs_decisionbatch_change", args=[batch.pk]))

    def _preview_again(self, request, form):
        """The preview of a valid selection as it is now (after a refused submission: a
        new fingerprint), or the selection again when no preview can be made."""
        try:
            preview = batch_preview(
                user=request.user,
                token_ids=form.cleaned_data["steps"],
                kind=form.cleaned_data["kind"],
                rationale=form.cleaned_data["rationale"],
                checks=form.check_answers(),
            )
        except BatchRefused as exc:
            messages.error(request, str(exc))
            return self.select_view(request, form)
        return self.render_preview(request, preview, form)

    # -- one batch ------------------------------------------------------------------------

    def get_batch(self, request, object_id) -> DecisionBatch:
        if not self.has_view_permission(request):
            raise PermissionDenied
        batch = self.get_object(request, str(object_id))  # None for a malformed id too
        if batch is None:
            raise Http404(_("No decision batch has id %(id)s.") % {"id": object_id})
        return batch

    def change_view(self, request, object_id, form_url="", extra_context=None):
        batch = self.get_batch(request, unquote(object_id))
        items = list(
            batch.items.select_related("decision", "token__instance__definition")
            .prefetch_related("decision__evidence")
            .order_by("token__instance_id", "token_id")
        )
        user = request.user
        return self.render(
            request,
            "detail.html",
            _("Decision batch %(id)s") % {"id": batch.pk},
            batch=batch,
            items=[(item, decision_evidence(item.decision)) for item in items],
            awaiting=batch.state == BatchState.REQUESTED,
            own=batch.requested_by_id == user.pk,
            may_approve=user.has_perm(APPROVE),
            reject_form=RejectDecisionForm(auto_id="id_batch_reject_%s"),
        )

    def approve_view(self, request, object_id: int):
        batch = self.get_batch(request, object_id)
        require(request, APPROVE)
        return self._act(
            request,
            batch,
            lambda: batch_approve(batch_id=batch.pk, actor=request.user),
            _(
                "Batch %(id)s is approved: each decision is recorded and each step moved as "
                "it says; the instances go on."
            ),
        )

    def reject_view(self, request, object_id: int):
        batch = self.get_batch(request, object_id)
        require(request, APPROVE)
        return self._act(
            request,
            batch,
            lambda: batch_reject(
                batch_id=batch.pk, actor=request.user, note=request.POST.get("note", "")
            ),
            _("Batch %(id)s is rejected; its steps still wait for a decision."),
        )

    def _act(self, request, batch, call, done: str):
        page = reverse("admin:handoffs_decisionbatch_change", args=[batch.pk])
        if request.method != "POST":
            return redirect(page)
        try:
            call()
        except REFUSALS as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, done % {"id": batch.pk})
        return redirect(page)


def _checks(action):
    return action.checks if action else ()


def _attr(token, name: str):
    return token.instance.definition_id if name == "definition" else token.instance.tenant


def _groups(steps):
    """The kinds of the user's uncertain steps: (action, workflow, tenant) and how many."""
    tokens = list(steps)
    standing = operations_standing(t.operation_key for t in tokens)
    counted = Counter(
        (standing[t.operation_key].action, t.instance.definition, t.instance.tenant)
        for t in tokens
        if t.operation_key in standing
    )
    return [
        {"action": a, "definition": d, "tenant": te, "count": n}
        for (a, d, te), n in sorted(
            counted.items(), key=lambda kv: (kv[0][0], kv[0][1].pk, kv[0][2])
        )
    ]


def _previewed(pairs: list[str]) -> list[tuple[str, int]]:
    """``<operation key>:<revision>`` pairs, as the preview page carries them."""
    out = []
    for pair in pairs:
        key, _sep, revision = pair.rpartition(":")
        if key and revision.isascii() and revision.isdigit():
            out.append((key, int(revision)))
    return out
