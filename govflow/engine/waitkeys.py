"""The key a step waiting for a message is found by, and the value it is correlated by.

A waiting step stores ``<message>:<correlation>`` in ``Token.wait_key`` (indexed with the
wait kind), and a delivery finds its step by the same text. Two rules keep one key from
naming two waits:

- a ``:`` or ``\\`` in the message name is escaped (``\\:``, ``\\\\``), so the first bare
  ``:`` ends the name: ``permit:approved`` + ``X`` and ``permit`` + ``approved:X`` differ.
  Names without either (every name seen so far) keep the key they always had;
- a key longer than the column is refused, never cut: two keys cut to the same 300
  characters would name the same wait.

A correlation value is a string or a whole number; ``5`` is correlated as ``"5"``. Other
JSON values (null, true, 1.5, objects) are refused in words: Python's ``str`` of them
(``None``, ``True``) is no value a client would send.
"""

from __future__ import annotations

from typing import Any

from django.db.models import OuterRef, Value
from django.db.models.functions import Concat, Replace

WAIT_KEY_MAX = 300
"""``Token.wait_key``'s column."""
MESSAGE_MAX = CORRELATION_MAX = 200
"""``TriggerDelivery.message`` and ``.correlation``'s columns."""

__all__ = [
    "CORRELATION_MAX",
    "MESSAGE_MAX",
    "WAIT_KEY_MAX",
    "correlation_text",
    "message_key",
    "message_key_sql",
]


def _escaped(message: str) -> str:
    return message.replace("\\", "\\\\").replace(":", "\\:")


def message_key(message: str, correlation: str) -> str | None:
    """The wait key of ``message`` correlated by ``correlation``; None when it would be
    longer than the column (such a wait could never be told apart)."""
    key = f"{_escaped(message)}:{correlation}"
    return key if len(key) <= WAIT_KEY_MAX else None


def message_key_sql():
    """The same key as an SQL expression over the outer query's delivery (its ``message``
    and ``correlation`` columns), for a subquery of the steps waiting for it."""
    name = Replace(OuterRef("message"), Value("\\"), Value("\\\\"))
    return Concat(Replace(name, Value(":"), Value("\\:")), Value(":"), OuterRef("correlation"))


def correlation_text(value: Any) -> str | None:
    """The text a delivery must carry to match ``value``; None for a value that cannot
    correlate (not a string or a whole number)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    return str(value)
