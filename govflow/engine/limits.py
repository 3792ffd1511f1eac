"""What a caller may send the engine: one check per kind of input, shared by every door.

Forms, ``load_workflows``, Python callers and the coming API all reach the same services,
and each service admits its input here before anything is stored, through the recovery
core's input guard (``recovery.api.input_guard``): size, depth, U+0000, lone surrogates,
non-finite numbers and unsafe integers are refused with the path of the offending value.
``docs/definitions.md`` ("Input limits") lists the rules and ``docs/deployment.md`` the
settings.
"""

from __future__ import annotations

from typing import Any

from recovery.api import CanonicalError, input_guard

from .conf import definition_max_bytes, payload_max_bytes, variables_max_bytes
from .errors import InvalidRequest

__all__ = [
    "admit_json",
    "admit_text",
    "definition_max_bytes",
    "payload_max_bytes",
    "variables_max_bytes",
]


def admit_json(value: Any, *, what: str, max_bytes: int) -> bytes:
    """The canonical bytes of ``value``, or :class:`InvalidRequest` saying ``what`` is wrong.

    ``what`` starts the message, e.g. ``"Variables are malformed"``; the guard's own words
    (path, problem, what to do) follow.
    """
    try:
        return input_guard(value, max_bytes=max_bytes)
    except CanonicalError as exc:
        raise InvalidRequest(f"{what}: {exc}") from None


def admit_text(value: Any, *, name: str, max_length: int, required: bool = True) -> str:
    """A text field stored as it is (a tenant, a reason, a message name).

    Refuses what is not a string, an empty one when ``required``, more than ``max_length``
    characters, U+0000 and lone surrogates, naming the field.
    """
    if not isinstance(value, str) or (required and not value.strip()) or len(value) > max_length:
        raise InvalidRequest(
            f"{name} must be a {'non-empty ' if required else ''}string of at most "
            f"{max_length} characters."
        )
    try:
        input_guard(value, max_bytes=4 * max_length + 2)
    except CanonicalError as exc:
        raise InvalidRequest(f"{name}: the {exc.problem}. {exc.advice}") from None
    return value
