"""Bulk triage, the reading half: which uncertain steps a batch may take, and its preview.

A preview lists exactly the operations a batch would decide and what would be recorded for
each, and binds them with a fingerprint: BLAKE3 over the canonical list of operation keys
with their ledger revisions, the decision kind and what it records (rationale, check
answers). The submission recomputes the preview from the database and is refused, naming
what changed, when its fingerprint differs (ADR 0024). Reads only; a fixed number of
queries whatever the number of rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from blake3 import blake3
from django.db.models import QuerySet
from django.utils.translation import gettext as _

from govflow.engine.models import Definition, Token, TokenState
from govflow.engine.outputs import output_problems
from govflow.engine.registry import registry
from govflow.engine.services.definitions import trusted_spec
from govflow.engine.tenancy import instances_of
from recovery.api import DecisionKind, OperationState, canonical_bytes, operations_standing

from .services.desk import result_schema_of

BATCH_KINDS = (DecisionKind.EFFECT_CONFIRMED, DecisionKind.EFFECT_ABSENT)
MAX_ROWS = 200
"""The most operations one batch takes (a page an approver can still read)."""

_PREFIX = b"govflow:v1:decision-batch\x00"


class BatchRefused(Exception):
    """The batch cannot be previewed, submitted or approved as asked; nothing was recorded.

    The message says what is wrong and what to do."""


def batch_fingerprint(
    *, kind: str, rationale: str, checks: Mapping[str, str], operations: Iterable[tuple[str, int]]
) -> str:
    """BLAKE3 (domain ``decision-batch``) of what a batch decides, over canonical bytes."""
    value = {
        "kind": str(kind),
        "rationale": rationale,
        "checks": dict(checks),
        "operations": sorted([key, int(revision)] for key, revision in operations),
    }
    return blake3(_PREFIX + canonical_bytes(value)).hexdigest()


def uncertain_steps(user) -> QuerySet[Token]:
    """The user's steps whose outcome is unknown, oldest first (another tenant's: none)."""
    return (
        Token.objects.filter(
            state=TokenState.OUTCOME_UNKNOWN,
            instance__in=instances_of(user).values("pk"),
        )
        .exclude(operation_key="")
        .select_related("instance__definition")
        .order_by("updated_at", "pk")
    )


@dataclass(frozen=True)
class PreviewRow:
    token_id: int
    instance_id: int
    case_title: str
    step_title: str
    operation_key: str
    idempotency_key: str
    attempt: int
    revision: int

    @property
    def pair(self) -> str:
        """The row as the preview form carries it: ``<operation key>:<revision>``."""
        return f"{self.operation_key}:{self.revision}"


@dataclass
class BatchPreview:
    kind: str
    rationale: str
    checks: dict[str, str]
    action: str
    definition: Definition
    tenant: str
    rows: list[PreviewRow] = field(default_factory=list)

    @property
    def fingerprint(self) -> str:
        return batch_fingerprint(
            kind=self.kind,
            rationale=self.rationale,
            checks=self.checks,
            operations=[(r.operation_key, r.revision) for r in self.rows],
        )

    @property
    def kind_label(self) -> str:
        return DecisionKind(self.kind).label

    def records(self) -> str:
        """What approval records and does for each row, in words."""
        if self.kind == DecisionKind.EFFECT_CONFIRMED:
            return _(
                "Effect confirmed: the operation becomes effect_confirmed, the step completes "
                "and the instance goes on."
            )
        return _(
            "Effect absent: the operation becomes effect_absent, the step fails and the "
            "instance is blocked until someone retries it (same idempotency key) or cancels."
        )


def kind_of(token: Token, action: str) -> tuple[str, int, str]:
    return (action, token.instance.definition_id, token.instance.tenant)


def batch_preview(
    *, user, token_ids: Iterable[int], kind: str, rationale: str, checks: Mapping[str, str]
) -> BatchPreview:
    """The preview of a batch on ``token_ids``, or :class:`BatchRefused` saying why not."""
    wanted = _wanted(token_ids, kind)
    tokens = list(uncertain_steps(user).filter(pk__in=wanted))
    missing = sorted(set(wanted) - {t.pk for t in tokens})
    if missing:
        raise BatchRefused(
            _(
                "Step(s) %(ids)s are not among your steps whose outcome is unknown (decided "
                "meanwhile, or not yours to see). Nothing was recorded: select again."
            )
            % {"ids": ", ".join(map(str, missing))}
        )
    standing = operations_standing(t.operation_key for t in tokens)
    _refuse_unsettled(tokens, standing)
    kinds = {kind_of(t, standing[t.operation_key].action) for t in tokens}
    if len(kinds) > 1:
        described = "; ".join(
            _("%(action)s in %(workflow)s for %(tenant)s")
            % {"action": a, "workflow": _definition_label(tokens, d), "tenant": te}
            for a, d, te in sorted(kinds)
        )
        raise BatchRefused(
            _(
                "A batch takes steps of one kind only (the same action, workflow and "
                "tenant); this selection mixes %(n)s: %(kinds)s. Select the steps of one kind."
            )
            % {"n": len(kinds), "kinds": described}
        )
    action_name = standing[tokens[0].operation_key].action
    definition = tokens[0].instance.definition
    spec = trusted_spec(definition)
    preview = BatchPreview(
        kind=kind,
        rationale=rationale,
        checks=dict(checks),
        action=action_name,
        definition=definition,
        tenant=tokens[0].instance.tenant,
    )
    if kind == DecisionKind.EFFECT_CONFIRMED:
        _refuse_results_needed(tokens, spec, action_name)
    preview.rows = [
        PreviewRow(
            token_id=token.pk,
            instance_id=token.instance_id,
            case_title=f"{definition.title or definition.key} #{token.instance_id}",
            step_title=spec.nodes.get(token.node_id, {}).get("title") or token.node_id,
            operation_key=token.operation_key,
            idempotency_key=token.idempotency_key,
            attempt=token.attempt,
            revision=standing[token.operation_key].revision,
        )
        for token in sorted(tokens, key=lambda t: (t.instance_id, t.pk))
    ]
    return preview


def _wanted(token_ids: Iterable[int], kind: str) -> list[int]:
    """The selected step ids, once each, or a refusal of a selection no batch can take."""
    wanted = sorted({int(t) for t in token_ids})
    if not wanted:
        raise BatchRefused(_("Select at least one step whose outcome is unknown."))
    if len(wanted) > MAX_ROWS:
        raise BatchRefused(
            _("A batch takes at most %(max)s steps; select fewer.") % {"max": MAX_ROWS}
        )
    if kind not in BATCH_KINDS:
        raise BatchRefused(_("A batch records effect confirmed or effect absent."))
    return wanted


def _definition_label(tokens: list[Token], definition_id: int) -> str:
    definition = next(
        t.instance.definition for t in tokens if t.instance.definition_id == definition_id
    )
    return f"{definition.key} v{definition.version}"


def _refuse_unsettled(tokens: list[Token], standing) -> None:
    """Every operation must be in the ledger, of unknown outcome, with no decision open."""
    for token in tokens:
        op = standing.get(token.operation_key)
        where = _("step '%(step)s' of instance %(id)s") % {
            "step": token.node_id,
            "id": token.instance_id,
        }
        if op is None or op.state != OperationState.OUTCOME_UNKNOWN:
            raise BatchRefused(
                _("The ledger no longer says the outcome of %(where)s is unknown; leave it out.")
                % {"where": where}
            )
        if op.awaiting_decision:
            raise BatchRefused(
                _(
                    "%(where)s already has a decision awaiting approval: approve or reject "
                    "that one first, or leave the step out of the batch."
                )
                % {"where": where}
            )


def _refuse_results_needed(tokens: list[Token], spec, action_name: str) -> None:
    """Effect confirmed carries the step's result; a batch records it only when none is
    needed (ADR 0024): values differ per operation and are entered on each case's page."""
    action = registry.get(action_name)
    for token in tokens:
        node = spec.nodes.get(token.node_id, {})
        problems = output_problems(result_schema_of(action, node), {})
        if problems:
            raise BatchRefused(
                _(
                    "Effect confirmed on %(action)s records what each effect returned "
                    "(%(problems)s), which differs from one operation to the next: record "
                    "it on each instance's page. A batch can record effect absent for these "
                    "steps."
                )
                % {"action": action_name, "problems": "; ".join(problems)}
            )
