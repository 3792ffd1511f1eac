"""Reading request bodies: bounded, strict JSON, or a clear 400/413/415.

The size limit is applied twice, before anything is parsed: to the declared
``Content-Length`` (``ApiView.initial``, before authentication), and to the bytes actually
read (a body sent without a length). The text is read with the recovery core's strict
parser (``recovery.api.parse_json``: UTF-8, no duplicate keys, no NaN or Infinity, no
nesting past ``RECOVERY_INPUT_MAX_DEPTH``, never recursing) and the value admitted through
its input guard (``recovery.api.input_guard``: no U+0000, no lone surrogate, no number a
JSON reader would round or cannot carry). The services admit their own fields through the
same guard; refusing here answers an unreadable body with a 400 naming the place, before
any field is looked at.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser

from recovery.api import CanonicalError, input_guard, parse_json

from .problems import PayloadTooLarge


def max_body_bytes() -> int:
    return int(getattr(settings, "GOVFLOW_API_MAX_BODY_BYTES", 1024 * 1024))


class JSONParser(BaseParser):
    """``application/json`` bodies, read within the size limit and checked strictly."""

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        limit = max_body_bytes()
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise PayloadTooLarge(limit)
        try:
            value = parse_json(raw, max_bytes=limit)
            input_guard(value, max_bytes=limit)
        except CanonicalError as exc:
            raise ParseError(f"The body cannot be read: {exc}") from None
        return value
