"""The result a confirmed effect carries: admitted when requested, verified against the chain.

A decision confirming an effect stores the step's result beside its fingerprint, and its
request's checkpoint chains that fingerprint. A result edited in its row (or a fingerprint
edited to match it) then differs from the chain's, and verification says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .canonical import SAFE_INTEGER, FingerprintKind, fingerprint_value, input_guard
from .errors import CanonicalError, DecisionError
from .models import Decision
from .schemas import schema_problems
from .states import DecisionKind
from .subjects import Subject

__all__ = ["admit_result", "load_results", "result_mismatch"]


def admit_result(
    kind: str, result: Mapping | None, schema: Mapping | None, *, max_bytes: int
) -> tuple[dict | None, str]:
    """The result a decision stores and its fingerprint, or a refusal naming what is wrong.

    Only *effect confirmed* carries a result: what the effect returned (the step's output).
    With ``schema`` it must satisfy it; without one, any object (or none) is kept.
    """
    if kind != DecisionKind.EFFECT_CONFIRMED:
        if result is not None:
            label = DecisionKind(kind).label
            raise DecisionError(
                f"'{label}' carries no result: only an effect that happened returned "
                "something. Leave the result empty, or record effect confirmed."
            )
        return None, ""
    if result is None and schema is None:
        return None, ""
    value = {} if result is None else result
    if not isinstance(value, Mapping):
        raise DecisionError("The result of a confirmed effect must be an object of named values.")
    try:
        input_guard(value, max_bytes=max_bytes)
        unsafe = _unsafe_number(value)
        if unsafe:
            raise CanonicalError(unsafe, "the number is too large to keep exactly", "")
    except CanonicalError as exc:
        raise DecisionError(f"The result cannot be recorded as written: {exc}") from None
    problems = schema_problems(schema, value)
    if problems:
        raise DecisionError(
            "The result does not match what this step returns: "
            f"{'; '.join(problems)}. Enter the values the effect produced (for example from "
            "the provider's record); nothing was recorded."
        )
    value = dict(value)
    return value, fingerprint_value(FingerprintKind.RESULT, value)


def _unsafe_number(value: Mapping) -> str:
    """The path of a number the database may give back in another form, or ''.

    A float beyond ±(2**53 - 1) is written with an exponent, and PostgreSQL's jsonb gives it
    back as an integer: its fingerprint would no longer match. Integers are limited there
    by the input guard already.
    """
    stack: list = [(value, "$")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, float) and abs(item) > SAFE_INTEGER:
            return path
        if isinstance(item, Mapping):
            stack += [(v, f"{path}.{k}") for k, v in item.items()]
        elif isinstance(item, list):
            stack += [(v, f"{path}[{i}]") for i, v in enumerate(item)]
    return ""


def result_mismatch(
    chained: dict[Any, tuple[str, int]], rows: Iterable[Sequence[Any]], length: int
) -> tuple[int, str] | None:
    """The checkpoint and reason of the first stored result that differs from the chain's.

    ``chained`` maps a decision id to the result fingerprint its request chained and that
    checkpoint's position; ``rows`` are (decision id, stored result, stored fingerprint).
    A decision whose request chained no result must store none.
    """
    for decision_id, result, result_fp in rows:
        expected, seq = chained.get(decision_id, ("", length + 1))
        stored = "" if result is None else fingerprint_value(FingerprintKind.RESULT, result)
        if result_fp != expected or stored != expected:
            return seq, (
                f"decision {decision_id}'s result differs from the one its request "
                "recorded in the chain (changed behind the chain's back)"
            )
    return None


def load_results(subject: Subject) -> list[Sequence[Any]]:
    """The (id, result, result fingerprint) of every decision on ``subject``'s operations."""
    return list(
        Decision.objects.filter(
            operation__subject_type=subject.type, operation__subject_id=subject.id
        ).values_list("pk", "result", "result_fp")
    )
