"""An instance's timeline: what happened to it, to the second, with who did it.

Built from the records that already exist, never from a second log: the checkpoint chain
(every ledger fact, decision and investigation), the steps (when each began and the state
it is in now), the timers (due and fired), the engine's incidents and the instance itself.
The engine keeps no history of a step's earlier states, so the timeline says when a step
began and when it reached the state it is in; the chain says everything in between that
touched the ledger. A fixed number of queries, however many steps the instance has.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.utils.translation import get_language, gettext_noop
from django.utils.translation import gettext as _

from govflow.engine.models import Instance, Timer, Token
from govflow.engine.selectors import engine_incidents_of
from recovery.api import OperationState, Subject, checkpoints_of

# Fact kinds in words (marked for translation, translated when shown); an unknown kind is
# shown as it is stored.
FACT_WORDS = {
    "projection": gettext_noop("Workflow state recorded on the chain"),
    "operation.recorded": gettext_noop("Ledger operation recorded (before dispatch)"),
    "operation.dispatched": gettext_noop("Dispatched to the provider"),
    "operation.observed": gettext_noop("Provider's answer observed"),
    "operation.observation": gettext_noop("Provider's finding recorded (kept as evidence)"),
    "decision.requested": gettext_noop("Decision requested"),
    "decision.approved": gettext_noop("Decision approved"),
    "decision.rejected": gettext_noop("Decision rejected"),
    "decision.withdrawn": gettext_noop("Decision withdrawn"),
    "engine.incident_resolved": gettext_noop("Engine incident resolved"),
    "engine.migration_requested": gettext_noop("Contract migration requested"),
    "engine.migration_rejected": gettext_noop("Contract migration rejected"),
    "engine.contract_migrated": gettext_noop("Contract migration approved"),
}
# The fact fields that name the person who did it.
ACTOR_FIELDS = ("approved_by", "rejected_by", "withdrawn_by", "resolved_by", "requested_by")


def in_sentence(label: str) -> str:
    """A state's name inside a sentence: lowercased in English ("is now outcome unknown");
    German keeps the capital its nouns carry ("ist jetzt Ergebnis unbekannt")."""
    if (get_language() or "en").startswith("de"):
        return str(label)
    return str(label)[:1].lower() + str(label)[1:]


def _state_words(state: str) -> str:
    try:
        return in_sentence(OperationState(state).label)
    except ValueError:  # a state this version does not know: shown as stored
        return state.replace("_", " ")


@dataclass(frozen=True)
class Entry:
    at: datetime
    kind: str  # step | ledger | decision | timer | incident | instance
    what: str
    who: str = ""
    detail: str = ""


def _fact(checkpoint) -> dict[str, Any]:
    try:
        fact = json.loads(checkpoint.fact)
    except ValueError:
        return {}
    return fact if isinstance(fact, dict) else {}


def _chain_entries(subject: Subject, step_of_key: dict[str, str]) -> list[Entry]:
    checkpoints = list(checkpoints_of(subject).only("seq", "kind", "fact", "recorded_at"))
    facts = [(c, _fact(c)) for c in checkpoints]
    ids = {f.get(k) for _, f in facts for k in ACTOR_FIELDS if isinstance(f.get(k), int)}
    names = {
        u.pk: u.get_username() for u in get_user_model().objects.filter(pk__in=ids)
    }  # one query for every actor of the chain
    entries = []
    for checkpoint, fact in facts:
        actor = next((fact[k] for k in ACTOR_FIELDS if isinstance(fact.get(k), int)), None)
        what = _(FACT_WORDS.get(checkpoint.kind, checkpoint.kind))
        state = fact.get("state")
        if checkpoint.kind == "operation.observed" and state:
            what = _("Provider's answer observed: %(state)s") % {"state": _state_words(state)}
        step = step_of_key.get(str(fact.get("operation", "")), "")
        detail = (
            _("#%(seq)s, step %(step)s") % {"seq": checkpoint.seq, "step": step}
            if step
            else (f"#{checkpoint.seq}")
        )
        kind = "decision" if checkpoint.kind.startswith("decision.") else "ledger"
        entries.append(Entry(checkpoint.recorded_at, kind, what, names.get(actor, ""), detail))
    return entries


def _step_entries(tokens: list[Token], titles: dict[str, str]) -> list[Entry]:
    entries = []
    for token in tokens:
        title = titles.get(token.node_id, token.node_id)
        entries.append(
            Entry(
                token.created_at,
                "step",
                _("Step “%(title)s” began") % {"title": title},
                detail=f"#{token.ordinal}",
            )
        )
        by = token.payload.get("by", "") if isinstance(token.payload, dict) else ""
        if token.updated_at != token.created_at or by:
            what = _("Step “%(title)s” is now %(state)s") % {
                "title": title,
                "state": in_sentence(token.get_state_display()),
            }
            if by and isinstance(token.payload, dict) and "approved" in token.payload:
                what = (
                    _("Step “%(title)s” approved")
                    if token.payload["approved"]
                    else _("Step “%(title)s” rejected")
                ) % {"title": title}
            entries.append(Entry(token.updated_at, "step", what, str(by), f"#{token.ordinal}"))
    return entries


def _timer_entries(instance: Instance, titles: dict[str, str], by_token) -> list[Entry]:
    entries = []
    for timer in Timer.objects.filter(instance=instance).only(
        "token_id", "due_at", "fired_at", "state"
    ):
        token = by_token.get(timer.token_id)
        title = titles.get(token.node_id, token.node_id) if token else "?"
        entries.append(
            Entry(
                timer.due_at,
                "timer",
                _("Timer of “%(title)s” due") % {"title": title},
                detail=timer.get_state_display(),
            )
        )
        if timer.fired_at:
            entries.append(
                Entry(timer.fired_at, "timer", _("Timer of “%(title)s” fired") % {"title": title})
            )
    return entries


def _incident_entries(instance: Instance, integrity) -> list[Entry]:
    entries = []
    for incident in integrity:
        entries.append(
            Entry(
                incident.detected_at,
                "incident",
                _("Integrity incident #%(pk)s opened") % {"pk": incident.pk},
                detail=incident.reason[:200],
            )
        )
        if incident.resolved_at:
            entries.append(
                Entry(
                    incident.resolved_at,
                    "incident",
                    _("Integrity incident #%(pk)s resolved") % {"pk": incident.pk},
                )
            )
    for incident in engine_incidents_of(instance).select_related("resolved_by"):
        entries.append(
            Entry(
                incident.created_at,
                "incident",
                _("Engine incident #%(pk)s opened: %(kind)s")
                % {"pk": incident.pk, "kind": incident.kind},
                detail=incident.message[:200],
            )
        )
    return entries


def instance_timeline(
    instance: Instance,
    tokens: list[Token],
    titles: dict[str, str],
    subject: Subject,
    operations,
    integrity=(),
) -> list[Entry]:
    """Everything that happened to ``instance``, oldest first (ties in a stable order).

    ``operations`` are the subject's ledger operations (already read for the page): they
    name the step of each fact about an operation; ``integrity`` its integrity incidents.
    """
    step_of_key = {op.key: titles.get(op.step_id, op.step_id) for op in operations}
    started_by = instance.started_by.get_username() if instance.started_by_id else ""
    entries = [Entry(instance.created_at, "instance", _("Instance started"), started_by)]
    entries += _step_entries(tokens, titles)
    entries += _chain_entries(subject, step_of_key)
    entries += _timer_entries(instance, titles, {t.pk: t for t in tokens})
    entries += _incident_entries(instance, integrity)
    if instance.completed_at:
        entries.append(
            Entry(
                instance.completed_at,
                "instance",
                _("Instance ended: %(status)s") % {"status": instance.get_status_display()},
            )
        )
    order = {"instance": 0, "step": 1, "ledger": 2, "decision": 3, "timer": 4, "incident": 5}
    return sorted(entries, key=lambda e: (e.at, order.get(e.kind, 9)))
