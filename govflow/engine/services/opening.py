"""A run's start: its lease taken and its instance loaded, in a transaction the run's
first commit closes (``handover.OpenedLoad``, ADR 0042)."""

from __future__ import annotations

from recovery.api import Fence

from ..conf import lease_ttl
from ..queue import Claim
from .handover import OpenedLoad
from .load import handed_over_and_loaded, load_run
from .reconnect import DROPPED, Reconnect
from .rows import rows_in_one
from .run import Run, instance_lease_key

__all__ = ["handed_over_and_loaded_run", "lease_and_load"]


def lease_and_load(instance_id: int, worker: str, claim: Claim | None):
    """Take the lease (a claim's handed over, else acquired) and read the instance: one
    transaction, left open for the run's first commit to close (``Run.opened``, ADR 0042).

    Workers ask no health check of their connection before each task (ADR 0030): one that
    died while idle (a server restart, a proxy's idle timeout) fails this, the run's first
    statement. That commit rolled back whole, so it is made again on a fresh connection
    (``reconnect``); a database that stays unreachable raises as before.
    """
    retry = Reconnect()
    while True:
        try:
            if claim is not None:
                return handed_over_and_loaded_run(instance_id, worker, claim)
            key = instance_lease_key(instance_id)
            return _opened(
                OpenedLoad.acquiring(key=key, holder=worker, ttl=lease_ttl()), instance_id
            )
        except DROPPED as exc:
            if not retry.again(exc, str(instance_id)):
                raise


def handed_over_and_loaded_run(instance_id: int, worker: str, claim: Claim):
    """The claim's lease handed over to ``worker`` and the instance loaded, in a
    transaction left open on the run (``handover``); ``StaleFence`` when the claim lapsed.
    Nothing to run (no such instance): committed here."""
    claimed = Fence(key=instance_lease_key(instance_id), holder=claim.holder, fence=claim.fence)
    opened = OpenedLoad.handing_over(claimed=claimed, holder=worker, ttl=lease_ttl())
    if not rows_in_one():
        return _opened(opened, instance_id)
    # The handover and the load: one statement (ADR 0060).
    fence, run = opened.begin_reading(
        lambda: handed_over_and_loaded(instance_id, claimed=claimed, holder=worker, ttl=lease_ttl())
    )
    return _left_open(opened, fence, run)


def _opened(opened: OpenedLoad, instance_id: int):
    """The lease taken and the instance loaded in a transaction left open on the run."""
    fence = opened.begin()
    try:
        run = load_run(instance_id, fence)
    except BaseException as exc:
        opened.rollback(exc, again=False)  # a dropped connection: made again whole
        raise
    return _left_open(opened, fence, run)


def _left_open(opened: OpenedLoad, fence: Fence, run: Run | None):
    if run is None:
        opened.commit()
    else:
        run.opened = opened
    return fence, run
