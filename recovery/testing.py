"""Helpers for tests of code that uses the recovery core (not imported by the app itself)."""

from __future__ import annotations

import itertools
from typing import Any

from .canonical import FingerprintKind, fingerprint_value
from .services.leases import Fence, lease_acquire
from .services.operations import RecordedOperation, operation_record
from .services.step_call import Observation, operation_observe_record
from .subjects import Subject

_counter = itertools.count(1)


def fingerprints(input_value: Any = None, *, definition: Any = None) -> dict[str, str]:
    """Fingerprints of a made-up invocation, as :func:`operation_record` takes them."""
    input_value = {"n": next(_counter)} if input_value is None else input_value
    return {
        "definition_fp": fingerprint_value(
            FingerprintKind.DEFINITION, definition or {"key": "test.flow", "version": 1}
        ),
        "input_fp": fingerprint_value(FingerprintKind.INPUT, input_value),
        "preview_fp": fingerprint_value(FingerprintKind.PREVIEW, {"says": "test"}),
        "access_fp": fingerprint_value(FingerprintKind.ACCESS_CONTEXT, {"tenant": "t1"}),
        "idempotency_fp": fingerprint_value(
            FingerprintKind.IDEMPOTENCY_KEY, f"idem-{next(_counter)}"
        ),
    }


def new_subject(prefix: str = "test.instance") -> Subject:
    return Subject(prefix, str(next(_counter)))


def live_fence(subject: Subject, holder: str = "worker-1", ttl: float = 60) -> Fence:
    return lease_acquire(key=f"lease:{subject}", holder=holder, ttl=ttl)


def record(
    subject: Subject,
    fence: Fence,
    *,
    input_value: Any = None,
    step_id: str = "step-1",
    action: str = "test.notify",
    mode: str = "non_atomic",
    ordinal: int = 0,
    state: str = "dispatched",
    nonce: str | None = None,
) -> RecordedOperation:
    """Record an operation with made-up fingerprints on ``subject``."""
    return operation_record(
        subject=subject,
        step_id=step_id,
        action=action,
        recovery_mode=mode,
        nonce=nonce or f"{subject.id}:{step_id}:{ordinal}:{next(_counter)}",
        ordinal=ordinal,
        fence=fence,
        state=state,
        **fingerprints(input_value),
    )


def chained_step(
    subject: Subject, fence: Fence, op: RecordedOperation, *, action: str = "test.notify"
) -> RecordedOperation:
    """One step as the engine writes it: ``op`` succeeded and the next operation dispatched
    in the same call (ADR 0031); returns the next operation."""
    _, recorded = operation_observe_record(
        observation=Observation(key=op.key, state="succeeded", fence=fence, result={"a": 1}),
        record={
            "subject": subject,
            "step_id": "step",
            "action": action,
            "recovery_mode": "non_atomic",
            "nonce": f"{subject.id}:step:{next(_counter)}",
            "ordinal": 0,
            "fence": fence,
            **fingerprints(),
        },
        projection_fp="",
    )
    return recorded
