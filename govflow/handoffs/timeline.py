"""An instance's timeline: what happened to it, to the second, with who did it.

Built from the records that already exist, never from a second log: the checkpoint chain
(every ledger fact, decision and investigation), the steps (when each began and the state
it is in now), the timers (due and fired), the engine's incidents and the instance itself.
The engine keeps no history of a step's earlier states, so the timeline says when a step
began and when it reached the state it is in; the chain says everything in between that
touched the ledger. A fixed number of queries, however many steps the instance has.

Shown in pages (:func:`timeline_page`), newest page first: an instance of 200 steps has
about a thousand entries, and a page that rendered them all took longer than an operator
should wait. The instance page shows the latest page and, before it, every older entry
that still needs a person (a step that is uncertain, failed or waiting for an approval, an
incident still open); the timeline's own page shows any page; the audit trail export holds
every fact. The sentences are translated once per timeline and the times formatted in
Python, not once per entry in the template.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.utils.translation import get_language, gettext_noop
from django.utils.translation import gettext as _

from govflow.engine.models import (
    Instance,
    InstanceStatus,
    Timer,
    TimerState,
    Token,
    TokenState,
    WaitKind,
)
from govflow.engine.selectors import engine_incidents_of, instance_steps
from govflow.engine.services.definitions import trusted_spec
from recovery.api import (
    IncidentStatus,
    OperationState,
    Subject,
    checkpoints_of,
    incidents_of,
    operations_of,
)

from .present import Times, node_titles

PAGE_ENTRIES = 50  # entries per page; the instance page shows the first (the latest)

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
    "engine.compensations_planned": gettext_noop("Compensations planned"),
    "compensation.recorded": gettext_noop("Compensation recorded (to undo this step)"),
    "compensation.approval_void": gettext_noop(
        "Compensation approval voided: what it was approved for changed"
    ),
}
# The timeline's sentences (translated once per timeline, see Words).
STARTED = gettext_noop("Instance started")
ENDED = gettext_noop("Instance ended: %(status)s")
OBSERVED = gettext_noop("Provider's answer observed: %(state)s")
ON_STEP = gettext_noop("#%(seq)s, step %(step)s")
BEGAN = gettext_noop("Step “%(title)s” began")
NOW = gettext_noop("Step “%(title)s” is now %(state)s")
APPROVED = gettext_noop("Step “%(title)s” approved")
REJECTED = gettext_noop("Step “%(title)s” rejected")
TIMER_DUE = gettext_noop("Timer of “%(title)s” due")
TIMER_FIRED = gettext_noop("Timer of “%(title)s” fired")
INTEGRITY_OPENED = gettext_noop("Integrity incident #%(pk)s opened")
INTEGRITY_RESOLVED = gettext_noop("Integrity incident #%(pk)s resolved")
ENGINE_OPENED = gettext_noop("Engine incident #%(pk)s opened: %(kind)s")
# The fact fields that name the person who did it.
ACTOR_FIELDS = ("approved_by", "rejected_by", "withdrawn_by", "resolved_by", "requested_by")
# A step in one of these states waits for a person: its entry is kept on the instance page
# however old it is (so is a waiting approval, and an incident still open).
NEEDS_A_PERSON = (TokenState.OUTCOME_UNKNOWN, TokenState.FAILED)


def in_sentence(label: str) -> str:
    """A state's name inside a sentence: lowercased in English ("is now outcome unknown");
    German keeps the capital its nouns carry ("ist jetzt Ergebnis unbekannt")."""
    if (get_language() or "en").startswith("de"):
        return str(label)
    return str(label)[:1].lower() + str(label)[1:]


class Words(dict):
    """Each sentence and state name of one timeline, translated once: a thousand entries
    share a few dozen of them, and a gettext per entry was most of the page's time."""

    def __missing__(self, msgid: str) -> str:
        text = self[msgid] = _(msgid)
        return text

    def label(self, choices, value: str) -> str:
        """``value``'s label in ``choices`` (a state this version does not know: as stored)."""
        key = f"{choices.__name__}:{value}"
        if key not in self:
            try:
                self[key] = str(choices(value).label)
            except ValueError:
                self[key] = value.replace("_", " ")
        return self[key]

    def state(self, choices, value: str) -> str:
        """``value``'s label inside a sentence (see :func:`in_sentence`)."""
        key = f"in:{choices.__name__}:{value}"
        if key not in self:
            self[key] = in_sentence(self.label(choices, value))
        return self[key]


@dataclass(frozen=True)
class Entry:
    at: datetime
    kind: str  # step | ledger | decision | timer | incident | instance
    what: str
    who: str = ""
    detail: str = ""
    attention: bool = False  # it still needs a person (kept on the instance page)
    when: str = ""  # ``at`` as the page shows it, set for the entries of a page
    iso: str = ""


def _fact(text: str) -> dict[str, Any]:
    try:
        fact = json.loads(text)
    except ValueError:
        return {}
    return fact if isinstance(fact, dict) else {}


def _chain_entries(subject: Subject, step_of_key: dict[str, str], words: Words) -> list[Entry]:
    rows = checkpoints_of(subject).values_list("seq", "kind", "fact", "recorded_at")
    facts = [(seq, kind, _fact(fact), at) for seq, kind, fact, at in rows]
    ids = {f.get(k) for *_, f, _ in facts for k in ACTOR_FIELDS if isinstance(f.get(k), int)}
    names = {
        u.pk: u.get_username() for u in get_user_model().objects.filter(pk__in=ids)
    }  # one query for every actor of the chain
    entries = []
    for seq, kind, fact, at in facts:
        actor = next((fact[k] for k in ACTOR_FIELDS if isinstance(fact.get(k), int)), None)
        what = words[FACT_WORDS[kind]] if kind in FACT_WORDS else kind
        state = fact.get("state")
        if kind == "operation.observed" and state:
            what = words[OBSERVED] % {"state": words.state(OperationState, str(state))}
        about = fact.get("operation") or fact.get("original") or fact.get("compensation")
        step = step_of_key.get(str(about or ""), "")
        detail = words[ON_STEP] % {"seq": seq, "step": step} if step else f"#{seq}"
        kind = "decision" if kind.startswith("decision.") else "ledger"
        entries.append(Entry(at, kind, what, names.get(actor, ""), detail))
    return entries


def _needs_a_person(token: Token) -> bool:
    waits = token.state == TokenState.WAITING and token.wait_kind == WaitKind.APPROVAL
    return token.state in NEEDS_A_PERSON or waits


def _step_entries(tokens: list[Token], titles: dict[str, str], words: Words) -> list[Entry]:
    entries = []
    for token in tokens:
        title = titles.get(token.node_id, token.node_id)
        ordinal, attention = f"#{token.ordinal}", _needs_a_person(token)
        by = token.payload.get("by", "") if isinstance(token.payload, dict) else ""
        now = token.updated_at != token.created_at or bool(by)
        began = words[BEGAN] % {"title": title}
        entries.append(Entry(token.created_at, "step", began, "", ordinal, attention and not now))
        if now:
            what = words[NOW] % {"title": title, "state": words.state(TokenState, token.state)}
            if by and isinstance(token.payload, dict) and "approved" in token.payload:
                what = words[APPROVED if token.payload["approved"] else REJECTED] % {"title": title}
            entries.append(Entry(token.updated_at, "step", what, str(by), ordinal, attention))
    return entries


def _timer_entries(instance: Instance, titles: dict[str, str], by_token, words) -> list[Entry]:
    entries = []
    for timer in Timer.objects.filter(instance=instance).only(
        "token_id", "due_at", "fired_at", "state"
    ):
        token = by_token.get(timer.token_id)
        title = titles.get(token.node_id, token.node_id) if token else "?"
        state = words.label(TimerState, timer.state)
        entries.append(
            Entry(timer.due_at, "timer", words[TIMER_DUE] % {"title": title}, detail=state)
        )
        if timer.fired_at:
            entries.append(Entry(timer.fired_at, "timer", words[TIMER_FIRED] % {"title": title}))
    return entries


def _incident_entries(integrity, engine_incidents, words: Words) -> list[Entry]:
    entries = []
    for incident in integrity:
        entries.append(
            Entry(
                incident.detected_at,
                "incident",
                words[INTEGRITY_OPENED] % {"pk": incident.pk},
                detail=incident.reason[:200],
                attention=incident.status == IncidentStatus.OPEN,
            )
        )
        if incident.resolved_at:
            what = words[INTEGRITY_RESOLVED] % {"pk": incident.pk}
            entries.append(Entry(incident.resolved_at, "incident", what))
    for incident in engine_incidents:
        entries.append(
            Entry(
                incident.created_at,
                "incident",
                words[ENGINE_OPENED] % {"pk": incident.pk, "kind": incident.kind},
                detail=incident.message[:200],
                attention=incident.resolved_at is None,
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
    engine_incidents=None,
) -> list[Entry]:
    """Everything that happened to ``instance``, oldest first (ties in a stable order).

    ``operations`` are the subject's ledger operations (already read for the page): they
    name the step of each fact about an operation; ``integrity`` its integrity incidents,
    ``engine_incidents`` the engine's (read here when not given).
    """
    words = Words()
    step_of_key = {op.key: titles.get(op.step_id, op.step_id) for op in operations}
    started_by = instance.started_by.get_username() if instance.started_by_id else ""
    entries = [Entry(instance.created_at, "instance", words[STARTED], started_by)]
    entries += _step_entries(tokens, titles, words)
    entries += _chain_entries(subject, step_of_key, words)
    entries += _timer_entries(instance, titles, {t.pk: t for t in tokens}, words)
    if engine_incidents is None:
        engine_incidents = engine_incidents_of(instance)
    entries += _incident_entries(integrity, engine_incidents, words)
    if instance.completed_at:
        what = words[ENDED] % {"status": words.label(InstanceStatus, instance.status)}
        entries.append(Entry(instance.completed_at, "instance", what))
    order = {"instance": 0, "step": 1, "ledger": 2, "decision": 3, "timer": 4, "incident": 5}
    return sorted(entries, key=lambda e: (e.at, order.get(e.kind, 9)))


def instance_timeline_read(instance: Instance, subject: Subject) -> list[Entry]:
    """:func:`instance_timeline`, reading what it needs (the timeline's own page)."""
    titles = node_titles(trusted_spec(instance.definition))
    operations = operations_of(subject).only("key", "step_id")
    integrity = incidents_of(subject)
    return instance_timeline(
        instance, list(instance_steps(instance)), titles, subject, operations, integrity
    )


@dataclass(frozen=True)
class TimelinePage:
    """One page of a timeline, oldest entry first; page 1 holds the latest entries."""

    entries: list[Entry]
    number: int
    pages: int
    total: int
    earlier: list[Entry]  # older than this page and still needing a person (page 1 only)

    @property
    def older(self) -> int | None:
        return self.number + 1 if self.number < self.pages else None

    @property
    def newer(self) -> int | None:
        return self.number - 1 if self.number > 1 else None

    @property
    def rows(self) -> list[Entry | None]:
        """What the table lists: the earlier entries that need a person, then a gap (None)
        where the older pages' entries would be, then this page's entries."""
        return [*self.earlier, None, *self.entries] if self.earlier else self.entries

    @property
    def hidden(self) -> int:
        """Entries on the other pages (not shown here)."""
        return self.total - len(self.entries) - len(self.earlier)


def timeline_page(
    entries: list[Entry], number: int = 1, *, size: int | None = None, earlier: bool = False
) -> TimelinePage:
    """Page ``number`` of ``entries`` (clamped to the pages there are), counted from the
    latest; with ``earlier``, the older entries that still need a person come with it.
    Only the entries of the page have their times formatted."""
    size = size or PAGE_ENTRIES
    total = len(entries)
    pages = max(1, -(-total // size))
    number = min(max(1, number), pages)
    end = total - (number - 1) * size
    begin = max(0, end - size)
    times = Times()

    def shown(entry: Entry) -> Entry:
        return replace(entry, when=times.short(entry.at), iso=entry.at.isoformat())

    kept = [shown(e) for e in entries[:begin] if e.attention] if earlier else []
    return TimelinePage([shown(e) for e in entries[begin:end]], number, pages, total, kept)
