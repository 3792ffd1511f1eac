"""Cursor pagination: stable pages while rows are added, newest first.

A ``cursor`` not made by this API, or a ``page_size`` that is not a whole number from 1 to
500, is a 400: a client that sends one has a bug, and a silently different page would hide it.
"""

from __future__ import annotations

import binascii
import re
from base64 import b64decode
from urllib.parse import parse_qsl

from rest_framework.exceptions import NotFound, ParseError
from rest_framework.pagination import CursorPagination

_POSITION = re.compile(r"^[0-9]{1,18}\Z")
_PAGE_SIZE = re.compile(r"^[0-9]{1,3}\Z")
_FIELDS = frozenset({"o", "r", "p"})
"""What a cursor this API gives out holds (DRF's ``encode_cursor``): offset, reverse, position."""


def _made_here(encoded: str) -> bool:
    """Whether ``encoded`` has the shape of a cursor this API gives out: strict base64 of a
    query of DRF's three fields, each at most once. DRF's own decoding is lenient: it drops
    any character that is not base64, so ``%%%`` decoded to no field at all, the first page.
    """
    try:
        text = b64decode(encoded.encode("ascii"), validate=True).decode("ascii")
        fields = [name for name, _ in parse_qsl(text, keep_blank_values=True, strict_parsing=True)]
    except (UnicodeError, binascii.Error, ValueError):
        return False
    return bool(fields) and set(fields) <= _FIELDS and len(fields) == len(set(fields))


class IdCursorPagination(CursorPagination):
    """Pages of ``page_size`` (default 50, at most 500), newest first (by id).

    ``next`` and ``previous`` are full URLs to follow as they are.
    """

    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
    page_size_query_description = "Results per page (1 to 500; default 50)."
    cursor_query_description = "The page to return: take it from 'next' or 'previous'."

    def get_page_size(self, request) -> int:
        values = request.query_params.getlist(self.page_size_query_param)
        if not values:
            return self.page_size
        if len(values) > 1 or not _PAGE_SIZE.match(values[0]):
            raise self._bad_page_size()
        size = int(values[0])
        if not 1 <= size <= self.max_page_size:
            raise self._bad_page_size()
        return size

    def _bad_page_size(self) -> ParseError:
        return ParseError(
            f"page_size is a whole number from 1 to {self.max_page_size}, given once."
        )

    def decode_cursor(self, request):
        given = request.query_params.getlist(self.cursor_query_param)
        if len(given) > 1 or (given and given[0] and not _made_here(given[0])):
            raise self._bad_cursor()
        try:
            cursor = super().decode_cursor(request)
        except NotFound:
            raise self._bad_cursor() from None
        position = cursor.position if cursor is not None else None
        if position is not None and not _POSITION.match(position):
            raise self._bad_cursor()
        return cursor

    @staticmethod
    def _bad_cursor() -> ParseError:
        return ParseError(
            "The cursor is not one this API gave out. Follow the 'next' and 'previous' "
            "links of a page as they are."
        )

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": self.max_page_size,
                }
        return parameters


class LedgerCursorPagination(IdCursorPagination):
    """Oldest first: a ledger is read in the order it was written."""

    ordering = "id"
    page_size = 100


class ChainCursorPagination(IdCursorPagination):
    """In chain order (by sequence number)."""

    ordering = "seq"
    page_size = 100
