"""Reading request bodies: bounded, strict JSON, or a clear 400/413/415.

The size limit is applied twice, before anything is parsed: to the declared
``Content-Length`` (``BodyLimitMixin`` in the views, before authentication), and to the
bytes actually read (a body sent without a length). Strict means: UTF-8, no NaN or
infinity, no duplicate keys (the engine's own admin parser), at most ``MAX_DEPTH`` levels
of nesting, no NUL character and no lone surrogate in any string, no number that is not
finite. Such values cannot be stored or fingerprinted; refusing them here, with the place
they were found, keeps every later step from meeting them.
"""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser

from govflow.engine.forms import parse_json

from .problems import PayloadTooLarge

MAX_DEPTH = 64


def max_body_bytes() -> int:
    return int(getattr(settings, "GOVFLOW_API_MAX_BODY_BYTES", 1024 * 1024))


def value_problem(value: Any) -> str:
    """Where and why a parsed JSON value cannot be accepted, or ''. Iterative: any depth."""
    stack: list[tuple[Any, str, int]] = [(value, "$", 1)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"{path}: nested more than {MAX_DEPTH} levels deep"
        if isinstance(item, str):
            problem = _string_problem(item)
            if problem:
                return f"{path}: {problem}"
        elif isinstance(item, float) and not math.isfinite(item):
            return f"{path}: the number is too large to be carried as a finite number"
        elif isinstance(item, dict):
            for key, child in item.items():
                problem = _string_problem(key)
                if problem:
                    return f"{path}: an object key {problem.replace('the string ', '')}"
                stack.append((child, f"{path}.{key}", depth + 1))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item))
    return ""


def _string_problem(text: str) -> str:
    if "\x00" in text:
        return "the string holds a NUL character (U+0000), which cannot be stored"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "the string holds a lone surrogate (\\ud800-\\udfff), which is not Unicode"
    return ""


class JSONParser(BaseParser):
    """``application/json`` bodies, read within the size limit and checked strictly."""

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        limit = max_body_bytes()
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise PayloadTooLarge(limit)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(
                f"The body is not UTF-8 (byte {exc.start} cannot be decoded). JSON bodies "
                "are UTF-8."
            ) from None
        try:
            value = parse_json(text)
        except ValueError as exc:
            raise ParseError(f"The body is not valid JSON: {exc}.") from None
        problem = value_problem(value)
        if problem:
            raise ParseError(f"The body cannot be accepted: {problem}.")
        return value
