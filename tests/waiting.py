"""Waiting for a condition in a test: poll it, and fail saying what never came.

Tests of threads, sessions and processes wait for conditions, never for fixed times, so
that they pass on a busy machine; the bound only decides when to give up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    *,
    timeout: float = 20,
    what: str,
    interval: float = 0.02,
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` every ``interval`` seconds until it returns something truthy,
    and return that; after ``timeout`` seconds fail with ``what`` (and ``explain()``: the
    state that may say why)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            detail = f"\n{explain()}" if explain else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{detail}")
        time.sleep(interval)
    return value
