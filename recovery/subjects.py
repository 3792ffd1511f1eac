"""Subjects: what a checkpoint chain and its ledger operations are about."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import RecoveryValidationError


@dataclass(frozen=True, order=True)
class Subject:
    """A generic subject, such as ``Subject("govflow.instance", "42")``."""

    type: str
    id: str

    def __post_init__(self) -> None:
        for name, value in (("type", self.type), ("id", self.id)):
            if not isinstance(value, str) or not value or len(value) > 100:
                raise RecoveryValidationError(
                    f"A subject {name} must be a string of 1-100 characters, not {value!r}."
                )

    @classmethod
    def parse(cls, text: str) -> Subject:
        """Parse ``"type:id"`` (the form ``recovery_verify --subject`` takes)."""
        kind, sep, ident = text.partition(":")
        if not sep:
            raise RecoveryValidationError(
                f"{text!r} is not a subject; write it as type:id, e.g. govflow.instance:42."
            )
        return cls(kind, ident)

    def __str__(self) -> str:
        return f"{self.type}:{self.id}"
