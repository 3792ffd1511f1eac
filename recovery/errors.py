"""Typed errors of the recovery core.

Every error says what happened, what it means and what to do. Views map
:class:`ConflictError` subclasses to HTTP 409, :class:`RecoveryValidationError`
subclasses to HTTP 400, and :class:`IntegrityViolation` subclasses to HTTP 423 (locked:
nothing moves until an integrity incident is resolved).

An :class:`IntegrityViolation` is never a :class:`ConflictError`: a conflict means
"someone else moved first, reload and carry on"; an integrity violation means "the stored
facts contradict each other or were changed behind the ledger's back" and must stop the
subject for a person, never be retried away.
"""

from __future__ import annotations


class RecoveryError(Exception):
    """Base class of every error raised by :mod:`recovery`."""


class RecoveryValidationError(RecoveryError, ValueError):
    """The caller passed something malformed; nothing was recorded."""


class ConflictError(RecoveryError):
    """The stored state does not allow this change; nothing was changed."""


class CanonicalError(RecoveryValidationError):
    """A value cannot be turned into canonical bytes.

    ``path`` names the offending place in the value, such as ``$.applicant.ids[2]``;
    ``problem`` says what is wrong there and ``advice`` what to do about it.
    """

    DEFAULT_ADVICE = (
        "Canonical values are JSON: objects with string keys, arrays, strings, finite "
        "numbers, true, false and null."
    )

    def __init__(self, path: str, problem: str, advice: str | None = None) -> None:
        self.path = path
        self.problem = problem
        self.advice = advice or self.DEFAULT_ADVICE
        super().__init__(f"{path}: {problem}. {self.advice}")


class EmptyNonce(RecoveryValidationError):
    """An operation key was asked for without a durable nonce."""


class StaleFence(ConflictError):
    """A write carried a fence that is no longer the lease's current, unexpired fence."""


class LeaseHeld(ConflictError):
    """Someone else holds an unexpired lease on the resource."""


class OperationExists(ConflictError):
    """An operation with this key was already recorded."""


class OperationNotFound(RecoveryError, LookupError):
    """No ledger operation has this key."""


class InvalidTransition(ConflictError):
    """The operation's current state does not allow the requested state."""


class ContradictoryObservation(ConflictError):
    """A terminal observation contradicts the one already recorded (facts are monotonic)."""


class InputFingerprintMismatch(ConflictError):
    """The input presented now is not the input the operation was recorded with."""


class ChainConflict(ConflictError):
    """Another writer appended to the subject's checkpoint chain first."""


class IntegrityViolation(RecoveryError):
    """Stored facts contradict each other; the subject stops until an incident is resolved."""


class ChainBroken(IntegrityViolation):
    """The subject's checkpoint chain does not verify; success is refused.

    ``result`` is the :class:`recovery.chain.Verification` that failed.
    """

    def __init__(self, message: str, result: object) -> None:
        self.result = result
        super().__init__(message)


class IntegrityIncidentOpen(IntegrityViolation):
    """An open integrity incident on the subject blocks new effects and every success.

    ``incident_id`` names the incident when the refusal knows it; ``ledger_wide`` says it
    is the whole ledger's (the database is behind its anchors), not the subject's own.
    """

    def __init__(
        self, message: str, *, incident_id: int | None = None, ledger_wide: bool = False
    ) -> None:
        self.incident_id = incident_id
        self.ledger_wide = ledger_wide
        super().__init__(message)


class LedgerDisagrees(IntegrityViolation):
    """The ledger's last operation for an effect contradicts what the caller asked for.

    Raised by the dispatch write when the effect's idempotency key already has an
    operation that is in flight, of unknown outcome, or succeeded: a new dispatch would
    guess. ``operation`` is that operation's key and ``state`` its state.
    """

    def __init__(self, message: str, *, operation: str = "", state: str = "") -> None:
        self.operation = operation
        self.state = state
        super().__init__(message)


class ProjectionMismatch(IntegrityViolation):
    """The subject's projection (the engine's rows) differs from the one last checkpointed."""


class RevisionRollback(IntegrityViolation):
    """The stored state is older than a revision the reader has already seen."""


class DecisionError(RecoveryValidationError):
    """A decision request or approval is incomplete or not allowed."""


class DecisionConflict(ConflictError):
    """The decision was already approved, rejected or superseded."""


class EvidenceRejected(RecoveryValidationError):
    """An uploaded evidence file is empty, too large, or not an accepted type."""


class EvidenceCorrupt(IntegrityViolation):
    """A stored evidence file is missing or no longer matches its fingerprint; not served.

    ``incident_id`` is the integrity incident opened for it.
    """

    def __init__(self, message: str, *, incident_id: int | None = None) -> None:
        self.incident_id = incident_id
        super().__init__(message)


class ChainKeyError(RecoveryError):
    """The checkpoint chain keys in settings are missing or malformed."""


class AnchorStoreError(RecoveryError):
    """The anchor store cannot be read or written, or its own records do not verify."""


class CompensationRefused(ConflictError):
    """A compensation intent cannot be recorded for this operation; nothing was recorded.

    ``reason`` is a stable word (``ineligible``, ``exists``) for callers that map it.
    """

    def __init__(self, message: str, *, reason: str) -> None:
        self.reason = reason
        super().__init__(message)


class CompensationDrift(ConflictError):
    """What a compensation's approval was bound to moved before its dispatch.

    Nothing was dispatched; the approval was voided and a new one is needed.
    ``drift`` lists what moved (``revision``, ``input``, ``preview``, ``tenant``).
    """

    def __init__(self, message: str, *, drift: tuple[str, ...]) -> None:
        self.drift = drift
        super().__init__(message)
