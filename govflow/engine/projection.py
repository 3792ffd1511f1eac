"""An instance's projection under the checkpoint chain (invariant I12).

The engine's rows — an instance's variables and its steps' states — are a projection of
what the ledger decided. Each engine commit that changes them leaves the fingerprint of the
projection it wrote in the instance's checkpoint chain: carried by the commit's last ledger
write, or, when the commit made none, by a ``projection`` checkpoint of its own
(``Run.commit``). A run compares the stored rows with the newest recorded fingerprint
before it moves anything, and ``recovery_verify`` compares them through the reader
registered here, so an edited row is an integrity incident, never a way around a decision.

What the fingerprint covers, and why only that:

- the instance's pinned definition (id and fingerprint), tenant, access context and
  variables — everything a step's input and authority are built from;
- every *active* step (ready, waiting, executing, outcome unknown) by ordinal, node, a
  state class, attempt, poll, operation key and idempotency key. A step that leaves or
  re-enters the active set, changes class, or points at another operation changes it.

``ready`` and ``waiting`` are one class: timers, messages and approvals move a step
between them without the instance lease (and without a checkpoint), and neither state can
dispatch anything the ledger would not also check. Instance status, reasons, payloads of
waiting steps, back-off times and finished steps are not covered (docs/recovery.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from recovery.api import (
    FingerprintKind,
    Subject,
    canonical_bytes,
    fingerprint,
    projection_fingerprint,
)

from .models import Instance, Token, TokenState
from .token_reads import active_select

SUBJECT_TYPE = "govflow.instance"


def instance_subject(instance_id: int) -> Subject:
    """The recovery subject of an instance: its ledger operations, chain and incidents."""
    return Subject(SUBJECT_TYPE, str(instance_id))


_CLASS = {
    TokenState.READY: "open",
    TokenState.WAITING: "open",
    TokenState.EXECUTING: "executing",
    TokenState.OUTCOME_UNKNOWN: "outcome_unknown",
}


def projection_of(instance: Instance, tokens: Iterable[Token]) -> str:
    """The fingerprint of an instance's projection, from its row and its active tokens."""
    value: dict[str, Any] = {
        "definition": [instance.definition_id, instance.definition_fp],
        "tenant": instance.tenant,
        "access": instance.access or {},
        "variables": instance.variables,
        "steps": _steps(tokens),
    }
    return projection_fingerprint(value)


def _steps(tokens: Iterable[Token]) -> list[list[Any]]:
    return sorted(
        [
            t.ordinal,
            t.node_id,
            _CLASS[t.state],
            t.attempt,
            t.poll,
            t.operation_key or "",
            t.idempotency_key or "",
        ]
        for t in tokens
        if t.state in _CLASS
    )


CHECKED = False
"""Tests set it (``tests/conftest.py``): every fingerprint a :class:`Projector` gives is
compared with :func:`projection_of`'s, so a path that edits a run's variables without
saying so fails the test that takes it."""


class Projector:
    """:func:`projection_of` for one run's view, with the instance's part kept (ADR 0044).

    A chained step asks for its fingerprint three times (two ledger writes carry it, the
    commit's seal compares it) while its variables change once. The canonical bytes of a
    JSON object with sorted keys are those of its members in key order, so the bytes are
    put together from the instance's part (definition, tenant, access, variables: kept
    until the run's variables change) and the steps (made at every call: a few short
    rows). Equal bytes give the same fingerprint, so an unchanged view is not hashed again.

    What keeps the instance's part true: it is made again when the run's instance, its
    variables or its access are other objects than the ones it was made from, and when
    :meth:`variables_changed` says the variables were edited in place — which every path
    that edits them does (``Run.apply_output``, the one way a step's or a wait's output
    becomes variables). :data:`CHECKED` proves it under the tests.
    """

    __slots__ = ("_data", "_fp", "_head", "_head_of", "_of", "_tail")

    def __init__(self) -> None:
        self._of: tuple[Any, ...] = ()
        self._head_of: tuple[Any, ...] = ()
        self._head = self._tail = self._data = b""
        self._fp = ""

    def variables_changed(self) -> None:
        """The run's variables were edited in place: make the instance's part again."""
        self._of = ()

    def fingerprint(self, instance: Instance, tokens: Iterable[Token]) -> str:
        tokens = list(tokens)
        of = self._of
        if not (
            of and of[0] is instance and of[1] is instance.variables and of[2] is instance.access
        ):
            self._instance_part(instance)
            self._of = (instance, instance.variables, instance.access)
        data = self._head + _steps_bytes(tokens) + self._tail
        if data != self._data:
            self._data, self._fp = data, fingerprint(FingerprintKind.PROJECTION, data)
        if CHECKED and self._fp != projection_of(instance, tokens):
            raise AssertionError(
                f"The projection kept for instance {instance.pk} is stale: its variables "
                "were edited without Run.apply_output (Projector.variables_changed)."
            )
        return self._fp

    def _instance_part(self, instance: Instance) -> None:
        # '{"access":…,"definition":…}' and '{"tenant":…,"variables":…}': the members
        # before and after "steps", each object's own canonical bytes. The first changes
        # only with the access context (kept by identity: a run replaces it, never edits
        # it), the second with every output.
        head_of = self._head_of
        if not (head_of and head_of[0] is instance and head_of[1] is instance.access):
            head = {
                "access": instance.access or {},
                "definition": [instance.definition_id, instance.definition_fp],
            }
            self._head = canonical_bytes(head)[:-1] + b',"steps":'
            self._head_of = (instance, instance.access)
        tail = {"tenant": instance.tenant, "variables": instance.variables}
        # The variables were admitted as JSON before they became variables (input_guard,
        # or read from the database): no walk in front of the encoding.
        self._tail = b"," + canonical_bytes(tail, admitted=True)[1:]


# The canonical encoding's own options (``recovery.canonical``): for the steps' rows,
# which hold only the model fields' integers and strings, the walk in front of it would
# refuse nothing the encoder does not (a lone surrogate fails the UTF-8 encoding).
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def _steps_bytes(tokens: Iterable[Token]) -> bytes:
    return _ENCODER.encode(_steps(tokens)).encode("utf-8")


def stored_projection(subject_id: str) -> str:
    """Recompute an instance's projection from the stored rows ('' if it is gone)."""
    try:
        instance = Instance.objects.get(pk=int(subject_id))
    except (Instance.DoesNotExist, ValueError):
        return ""
    sql, params = active_select(instance.pk)
    return projection_of(instance, Token.objects.raw(sql, params))
