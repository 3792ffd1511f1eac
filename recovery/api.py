"""The public Python API of the recovery core. Import from here, not from submodules.

See ``docs/recovery.md`` for the model behind it and examples.
"""

from .canonical import FingerprintKind, canonical_bytes, fingerprint, fingerprint_value
from .chain import Verification, chain_verify, revision_require, subject_revision
from .errors import (
    CanonicalError,
    ChainBroken,
    ChainConflict,
    ChainKeyError,
    ConflictError,
    ContradictoryObservation,
    DecisionConflict,
    DecisionError,
    EmptyNonce,
    EvidenceRejected,
    InputFingerprintMismatch,
    IntegrityIncidentOpen,
    InvalidTransition,
    LeaseHeld,
    OperationExists,
    OperationNotFound,
    RecoveryError,
    RecoveryValidationError,
    RevisionRollback,
    StaleFence,
)
from .keys import idempotency_key, operation_key
from .services.decisions import decision_approve, decision_reject, decision_request
from .services.incidents import incident_open, incident_reverify, subject_verify
from .services.leases import (
    Fence,
    fence_condition,
    fenced_update,
    lease_acquire,
    lease_release,
    lease_renew,
)
from .services.operations import (
    RecordedOperation,
    operation_check_input,
    operation_dispatch,
    operation_observe,
    operation_record,
)
from .states import (
    TERMINAL,
    TRANSITIONS,
    DecisionKind,
    DecisionState,
    OperationState,
    RecoveryMode,
    can_transition,
)
from .subjects import Subject

__all__ = [
    "TERMINAL", "TRANSITIONS", "CanonicalError", "ChainBroken", "ChainConflict",
    "ChainKeyError", "ConflictError", "ContradictoryObservation", "DecisionConflict",
    "DecisionError", "DecisionKind", "DecisionState", "EmptyNonce", "EvidenceRejected",
    "Fence", "FingerprintKind", "InputFingerprintMismatch", "IntegrityIncidentOpen",
    "InvalidTransition", "LeaseHeld", "OperationExists", "OperationNotFound",
    "OperationState", "RecordedOperation", "RecoveryError", "RecoveryMode",
    "RecoveryValidationError", "RevisionRollback", "StaleFence", "Subject", "Verification",
    "can_transition", "canonical_bytes", "chain_verify", "decision_approve", "decision_reject",
    "decision_request", "fence_condition", "fenced_update", "fingerprint", "fingerprint_value",
    "idempotency_key", "incident_open", "incident_reverify", "lease_acquire", "lease_release",
    "lease_renew", "operation_check_input", "operation_dispatch", "operation_key",
    "operation_observe", "operation_record", "revision_require", "subject_revision",
    "subject_verify",
]
