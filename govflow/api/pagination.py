"""Cursor pagination: stable pages while rows are added, newest first.

A ``cursor`` not made by this API, or a ``page_size`` that is not a whole number from 1 to
500, is a 400: a client that sends one has a bug, and a silently different page would hide it.
"""

from __future__ import annotations

import re

from rest_framework.exceptions import NotFound, ParseError
from rest_framework.pagination import CursorPagination

_POSITION = re.compile(r"^[0-9]{1,18}$")
_PAGE_SIZE = re.compile(r"^[0-9]{1,3}$")


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
        if len(request.query_params.getlist(self.cursor_query_param)) > 1:
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
