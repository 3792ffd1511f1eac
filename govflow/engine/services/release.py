"""A run's lease released at its end, its chain's mark sealed for the next run (ADR 0066)."""

from __future__ import annotations

from recovery.api import Fence, chain_mark_store, lease_release_if_held


def release_sealed(fence: Fence, *, going_on: bool) -> bool:
    """Release ``fence`` if it is still live (False when it had lapsed), in the caller's
    commit. When the instance goes on (it waits, or stopped at its budget), the run's
    verified chain mark is sealed first, in the same commit, so that the instance's next
    run verifies its chain from there rather than whole."""
    if going_on:
        chain_mark_store(fence=fence)
    return lease_release_if_held(fence=fence)
