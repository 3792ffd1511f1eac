"""Typed engine errors. Views map ConflictError to HTTP 409 and InvalidRequest to 400."""

from __future__ import annotations

from recovery.api import ConflictError, IntegrityViolation, RecoveryValidationError


class EngineError(Exception):
    """Base class of engine errors."""


class InvalidRequest(EngineError, RecoveryValidationError):
    """The request is malformed or not allowed; nothing was recorded."""


class EngineConflict(EngineError, ConflictError):
    """The stored state does not allow this change now; nothing was changed."""


class DefinitionConflict(EngineConflict):
    """A published version never changes."""


class NotPermitted(InvalidRequest):
    """The actor lacks the permission this change needs."""


class IntegrityStop(EngineError, IntegrityViolation):
    """The instance is stopped by an integrity incident; nothing was changed."""
