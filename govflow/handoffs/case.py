"""The case of an uncertain step, as the operator who must decide it reads it.

What the action was to do (its title, the input and the preview, when they can be shown
truthfully), the keys the provider knows the effect by, every attempt and poll the ledger
recorded with its answer, answers that arrived too late to count, and the checks to follow.

The ledger stores fingerprints, never the input (invariant I1). The input is rebuilt from
the node's mapping and the instance's variables *now*, and shown only when its fingerprint
equals the one the ledger recorded at dispatch; the preview likewise. Otherwise the page
says that the input is not kept.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.utils.translation import gettext as _

from govflow.engine.models import Instance, KeptAnswer, Token
from govflow.engine.registry import ActionDefinition
from govflow.engine.variables import MissingVariable, build_input
from recovery.api import CanonicalError, FingerprintKind, fingerprint_value

from .present import flatten

log = logging.getLogger(__name__)


@dataclass
class HandoffCase:
    action: ActionDefinition | None
    idempotency_key: str
    operation_key: str
    attempts: list = field(default_factory=list)  # the step's ledger operations, oldest first
    input_rows: list = field(default_factory=list)
    preview_rows: list = field(default_factory=list)
    input_note: str = ""
    preview_note: str = ""
    kept: list = field(default_factory=list)  # answers kept while the ledger could not take them
    late: list = field(default_factory=list)  # late answers observed on this step's operations


def _rebuilt(node, variables, op) -> tuple[Any, str]:
    """The step's input if it is the one dispatched, else None and why it is not shown."""
    not_kept = _(
        "The input itself is not kept: the ledger stores only its fingerprint "
        "(%(fp)s…), so nothing secret or personal outlives the step."
    ) % {"fp": op.input_fp[:16]}
    try:
        value = build_input(node.get("input", {}), variables)
        same = fingerprint_value(FingerprintKind.INPUT, value) == op.input_fp
    except (MissingVariable, CanonicalError, TypeError, ValueError):
        return None, not_kept
    if not same:
        return None, not_kept + " " + _(
            "The variables changed since the dispatch, so it cannot be rebuilt from them."
        )
    return value, _(
        "Rebuilt from the instance's variables; its fingerprint equals the one the ledger "
        "recorded at dispatch (%(fp)s…), so this is the input the provider received."
    ) % {"fp": op.input_fp[:16]}


def _preview(action: ActionDefinition, value, op) -> tuple[Any, str]:
    try:
        preview = action.preview(value)
        same = fingerprint_value(FingerprintKind.PREVIEW, preview) == op.preview_fp
    except Exception as exc:  # a provider's preview is its code: never break the page
        log.warning("preview of %s raised %s on the desk", action.name, type(exc).__name__)
        return None, _("The provider's preview could not be computed again.")
    if not same:
        return None, _(
            "The provider's preview now differs from the one recorded at dispatch "
            "(fingerprint %(fp)s…): it is not shown."
        ) % {"fp": op.preview_fp[:16]}
    return preview, _("The preview recorded at dispatch (its fingerprint matches).")


def handoff_case(
    instance: Instance,
    token: Token,
    node,
    action: ActionDefinition | None,
    operations,
    late=(),
) -> HandoffCase:
    """The case of ``token`` (outcome unknown). ``operations`` are the instance's ledger
    operations and ``late`` its late answers, already read for the page; no further query
    but the kept answers."""
    idem_fp = (
        fingerprint_value(FingerprintKind.IDEMPOTENCY_KEY, token.idempotency_key)
        if token.idempotency_key
        else ""
    )
    attempts = [op for op in operations if op.idempotency_fp == idem_fp and idem_fp]
    case = HandoffCase(
        action=action,
        idempotency_key=token.idempotency_key,
        operation_key=token.operation_key,
        attempts=attempts,
        kept=list(KeptAnswer.objects.filter(token=token).order_by("received_at")),
    )
    keys = {op.key for op in attempts}
    case.late = [answer for answer in late if answer.operation.key in keys]
    current = next((op for op in attempts if op.key == token.operation_key), None)
    if current is None:
        case.input_note = _("The ledger has no operation for this step's key.")
        return case
    value, case.input_note = _rebuilt(node, instance.variables, current)
    if value is None:
        return case
    case.input_rows = flatten(value)
    if action is not None:
        preview, case.preview_note = _preview(action, value, current)
        case.preview_rows = flatten(preview) if preview is not None else []
    return case
