"""Leases and fences: one live holder, fences that only grow, expiry by the database clock."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.db.models import F
from django.forms.models import model_to_dict
from django.utils import timezone

from recovery import api
from recovery.models import Checkpoint, Lease, Operation
from recovery.testing import new_subject, record
from tests.dbclock import db_now, wait_until_expired

pytestmark = pytest.mark.django_db

KEY = "instance:42"


def lease_row(key: str = KEY) -> dict:
    return model_to_dict(Lease.objects.get(key=key))


@pytest.fixture
def rows(django_user_model):
    """Three engine rows a holder advances with fenced writes (stand-ins for instances)."""
    for name in ("ada", "bob", "cy"):
        django_user_model.objects.create(username=name, first_name="before")
    return django_user_model.objects.all()


def names(queryset) -> list[str]:
    return sorted(queryset.values_list("first_name", flat=True))


# --- acquiring -------------------------------------------------------------------------


def test_first_acquire_gets_fence_one_and_each_later_holder_a_larger_one():
    first = api.lease_acquire(key=KEY, holder="w1", ttl=30)
    assert (first.key, first.holder, first.fence) == (KEY, "w1", 1)
    api.lease_release(fence=first)
    second = api.lease_acquire(key=KEY, holder="w2", ttl=30)
    api.lease_release(fence=second)
    third = api.lease_acquire(key=KEY, holder="w1", ttl=30)
    assert [first.fence, second.fence, third.fence] == [1, 2, 3]
    assert lease_row()["fence"] == 3


def test_fences_are_counted_per_key():
    a = api.lease_acquire(key="instance:1", holder="w1", ttl=30)
    api.lease_release(fence=a)
    api.lease_acquire(key="instance:1", holder="w1", ttl=30)
    other = api.lease_acquire(key="instance:2", holder="w1", ttl=30)
    assert other.fence == 1


def test_a_live_lease_refuses_another_holder_and_names_the_current_one():
    held = api.lease_acquire(key=KEY, holder="worker-a", ttl=30)
    before = lease_row()
    with pytest.raises(api.LeaseHeld) as caught:
        api.lease_acquire(key=KEY, holder="worker-b", ttl=30)
    message = str(caught.value)
    assert "held by worker-a" in message and repr(KEY) in message
    assert "still in progress" in message
    assert lease_row() == before
    assert before["holder"] == "worker-a" and before["fence"] == held.fence


def test_the_holder_itself_cannot_reacquire_its_live_lease():
    api.lease_acquire(key=KEY, holder="worker-a", ttl=30)
    before = lease_row()
    with pytest.raises(api.LeaseHeld, match="held by worker-a"):
        api.lease_acquire(key=KEY, holder="worker-a", ttl=30)
    assert lease_row() == before


def test_an_expired_lease_is_taken_over_with_a_larger_fence():
    old = api.lease_acquire(key=KEY, holder="worker-a", ttl=0.2)
    with pytest.raises(api.LeaseHeld):
        api.lease_acquire(key=KEY, holder="worker-b", ttl=30)
    wait_until_expired(KEY)
    new = api.lease_acquire(key=KEY, holder="worker-b", ttl=30)
    assert new.fence == old.fence + 1
    row = lease_row()
    assert (row["holder"], row["fence"]) == ("worker-b", new.fence)
    with pytest.raises(api.StaleFence):
        api.lease_renew(fence=old, ttl=30)
    api.lease_renew(fence=new, ttl=30)


def test_release_keeps_the_fence_and_frees_the_lease():
    fence = api.lease_acquire(key=KEY, holder="w1", ttl=30)
    api.lease_release(fence=fence)
    row = Lease.objects.get(key=KEY)
    assert (row.holder, row.expires_at, row.fence) == (None, None, fence.fence)
    assert row.released_at is not None
    with pytest.raises(api.StaleFence, match="release the lease"):
        api.lease_release(fence=fence)
    with pytest.raises(api.StaleFence, match="renew the lease"):
        api.lease_renew(fence=fence, ttl=30)


def test_a_release_with_the_callers_parts_writes_them_with_it_or_not_at_all():
    """On PostgreSQL a caller's last writes may ride in the release's statement
    (``with_parts``): written with a live fence, refused with a stale one, nothing of the
    statement written then."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the parts are data-modifying WITH parts: PostgreSQL's")
    table = Lease._meta.db_table
    part = (
        [f"mine AS (UPDATE {table} SET fence = fence + 10 WHERE key = %s RETURNING 1)"],
        ["other"],
    )
    api.lease_acquire(key="other", holder="w0", ttl=30)
    fence = api.lease_acquire(key=KEY, holder="w1", ttl=30)
    api.lease_release(fence=fence, with_parts=part)
    assert Lease.objects.get(key=KEY).holder is None
    assert Lease.objects.get(key="other").fence == 11  # the part, written with it
    with pytest.raises(api.StaleFence, match="release the lease"):
        api.lease_release(fence=fence, with_parts=part)
    assert Lease.objects.get(key="other").fence == 11  # refused: the part not written


def test_a_handover_with_reads_moves_the_fence_and_returns_the_rows_or_changes_nothing():
    """On PostgreSQL a handover may carry the new holder's reads in its statement
    (``lease_handover_reading``): the rows as the statement began, none when the reads
    find none, and a stale fence refused with the lease row unchanged."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the handover is a data-modifying WITH: PostgreSQL's")
    claimed = api.lease_acquire(key=KEY, holder="pusher", ttl=30)
    reads = f"SELECT 1, holder, fence FROM {Lease._meta.db_table} WHERE key = %s"
    fence, rows = api.lease_handover_reading(
        fence=claimed, holder="w1", ttl=30, reads=reads, params=[KEY]
    )
    assert (fence.holder, fence.fence) == ("w1", claimed.fence + 1)
    assert rows == [(1, "pusher", claimed.fence)], "read as the statement began"
    again, none = api.lease_handover_reading(
        fence=fence, holder="w2", ttl=30, reads=reads, params=["no-such-key"]
    )
    assert again.fence == fence.fence + 1 and none == []
    before = model_to_dict(Lease.objects.get(key=KEY))
    with pytest.raises(api.StaleFence, match="hand the lease over"):
        api.lease_handover_reading(fence=fence, holder="w3", ttl=30, reads=reads, params=[KEY])
    assert model_to_dict(Lease.objects.get(key=KEY)) == before


# --- expiry is database time ----------------------------------------------------------


def test_expiry_is_ttl_seconds_after_the_database_clock():
    before = db_now()
    api.lease_acquire(key=KEY, holder="w1", ttl=30)
    after = db_now()
    expires_at = Lease.objects.get(key=KEY).expires_at
    slack = timedelta(milliseconds=2)  # SQLite's clock has millisecond resolution
    assert (
        before + timedelta(seconds=30) - slack
        <= expires_at
        <= after + timedelta(seconds=30) + slack
    )


def test_renew_extends_from_the_database_clock_not_from_the_old_expiry():
    fence = api.lease_acquire(key=KEY, holder="w1", ttl=1)
    first_expiry = Lease.objects.get(key=KEY).expires_at
    before = db_now()
    assert api.lease_renew(fence=fence, ttl=600) == fence
    renewed = Lease.objects.get(key=KEY).expires_at
    assert renewed >= before + timedelta(seconds=600) - timedelta(milliseconds=2)
    assert renewed > first_expiry
    shorter = api.lease_renew(fence=fence, ttl=5)
    assert Lease.objects.get(key=KEY).expires_at < renewed
    assert shorter.fence == fence.fence


def test_a_worker_clock_far_from_the_database_clock_changes_nothing(rows):
    fence = api.lease_acquire(key=KEY, holder="w1", ttl=30)
    ahead = timezone.now() + timedelta(hours=2)
    with mock.patch("django.utils.timezone.now", return_value=ahead):
        api.lease_renew(fence=fence, ttl=30)
        assert api.fenced_update(rows, fence=fence, first_name="ahead") == 3
        with pytest.raises(api.LeaseHeld):
            api.lease_acquire(key=KEY, holder="w2", ttl=30)
    short = api.lease_acquire(key="instance:short", holder="w1", ttl=0.2)
    wait_until_expired(short.key)
    behind = timezone.now() - timedelta(hours=2)
    with mock.patch("django.utils.timezone.now", return_value=behind):
        with pytest.raises(api.StaleFence):
            api.fenced_update(rows, fence=short, first_name="behind")
        assert api.lease_acquire(key=short.key, holder="w2", ttl=30).fence == 2
    assert names(rows) == ["ahead"] * 3


# --- wrong holder, wrong fence --------------------------------------------------------


@pytest.mark.parametrize(
    "change", [{"holder": "intruder"}, {"fence": 2}, {"fence": 0}, {"key": "instance:other"}]
)
def test_renew_and_release_need_the_exact_holder_and_fence(change):
    real = api.lease_acquire(key=KEY, holder="w1", ttl=30)
    forged = api.Fence(**{"key": real.key, "holder": real.holder, "fence": real.fence, **change})
    before = lease_row()
    with pytest.raises(api.StaleFence, match="no longer the live lease"):
        api.lease_renew(fence=forged, ttl=600)
    with pytest.raises(api.StaleFence, match="Nothing was changed"):
        api.lease_release(fence=forged)
    assert lease_row() == before
    api.lease_release(fence=real)  # the real holder still can


@pytest.mark.parametrize("change", [{"holder": "intruder"}, {"fence": 2}])
def test_a_forged_fence_cannot_write(rows, subject, change):
    real = api.lease_acquire(key=f"lease:{subject}", holder="w1", ttl=30)
    forged = api.Fence(**{"key": real.key, "holder": real.holder, "fence": real.fence, **change})
    with pytest.raises(api.StaleFence):
        api.fenced_update(rows, fence=forged, first_name="forged")
    with pytest.raises(api.StaleFence, match="Nothing was recorded"):
        record(subject, forged)
    assert names(rows) == ["before"] * 3
    assert not Operation.objects.filter(subject_id=subject.id).exists()
    assert not Checkpoint.objects.filter(subject_id=subject.id).exists()


# --- an expired holder changes nothing -------------------------------------------------


def _renew(fence, rows, subject):
    api.lease_renew(fence=fence, ttl=30)


def _release(fence, rows, subject):
    api.lease_release(fence=fence)


def _record(fence, rows, subject):
    record(subject, fence)


def _fenced_update(fence, rows, subject):
    api.fenced_update(rows, fence=fence, first_name="stale")


@pytest.mark.parametrize(
    "attempt",
    [_renew, _release, _record, _fenced_update],
    ids=["renew", "release", "record", "fenced_update"],
)
def test_an_expired_holder_cannot_act_and_changes_nothing(attempt, rows):
    subject = new_subject()
    fence = api.lease_acquire(key=f"lease:{subject}", holder="w1", ttl=0.2)
    record(subject, fence)  # a write while live succeeds
    wait_until_expired(fence.key)
    before = (
        lease_row(fence.key),
        names(rows),
        list(Operation.objects.filter(subject_id=subject.id).values()),
        list(Checkpoint.objects.filter(subject_id=subject.id).values()),
    )
    with pytest.raises(api.StaleFence, match="no longer the live lease"):
        attempt(fence, rows, subject)
    after = (
        lease_row(fence.key),
        names(rows),
        list(Operation.objects.filter(subject_id=subject.id).values()),
        list(Checkpoint.objects.filter(subject_id=subject.id).values()),
    )
    assert after == before
    assert len(after[2]) == 1 and after[1] == ["before"] * 3
    # The expired row still names the old holder, but the next holder takes over.
    assert after[0]["holder"] == "w1"
    assert api.lease_acquire(key=fence.key, holder="w2", ttl=30).fence == fence.fence + 1


def test_after_takeover_only_the_new_fence_can_record(subject):
    old = api.lease_acquire(key=f"lease:{subject}", holder="w1", ttl=0.2)
    wait_until_expired(old.key)
    new = api.lease_acquire(key=old.key, holder="w2", ttl=30)
    with pytest.raises(api.StaleFence):
        record(subject, old)
    op = record(subject, new)
    assert Operation.objects.get(key=op.key).fence == new.fence
    with pytest.raises(api.StaleFence):
        api.operation_observe(key=op.key, state="succeeded", fence=old)
    assert Operation.objects.get(key=op.key).state == "dispatched"
    api.operation_observe(key=op.key, state="succeeded", fence=new)
    assert api.chain_verify(subject).ok


# --- fenced_update ---------------------------------------------------------------------


def test_fenced_update_with_a_live_fence_updates_and_counts_rows(rows):
    fence = api.lease_acquire(key=KEY, holder="w1", ttl=30)
    count = api.fenced_update(
        rows.exclude(username="cy"), fence=fence, first_name="advanced", last_name=F("username")
    )
    assert count == 2
    assert list(rows.order_by("username").values_list("first_name", "last_name")) == [
        ("advanced", "ada"),
        ("advanced", "bob"),
        ("before", ""),
    ]


def test_fenced_update_matching_no_row_returns_zero_while_live_and_raises_when_stale(rows):
    fence = api.lease_acquire(key=KEY, holder="w1", ttl=0.2)
    assert api.fenced_update(rows.filter(username="nobody"), fence=fence, first_name="x") == 0
    wait_until_expired(KEY)
    with pytest.raises(api.StaleFence, match="Cannot write"):
        api.fenced_update(rows.filter(username="nobody"), fence=fence, first_name="x")


def test_fenced_update_after_release_changes_nothing(rows):
    fence = api.lease_acquire(key=KEY, holder="w1", ttl=30)
    api.lease_release(fence=fence)
    with pytest.raises(api.StaleFence):
        api.fenced_update(rows, fence=fence, first_name="late")
    assert names(rows) == ["before"] * 3


# --- bad arguments ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key": ""}, "lease key must be 1-200 characters"),
        ({"key": "k" * 201}, "lease key must be 1-200 characters"),
        ({"holder": ""}, "lease holder must be 1-200 characters"),
        ({"ttl": 0}, "ttl must be in"),
        ({"ttl": -1}, "ttl must be in"),
        ({"ttl": 86401}, "ttl must be in"),
        ({"ttl": float("nan")}, "ttl must be in"),
    ],
    ids=[
        "empty-key",
        "long-key",
        "empty-holder",
        "zero-ttl",
        "negative-ttl",
        "huge-ttl",
        "nan-ttl",
    ],
)
def test_bad_acquire_arguments_are_refused_and_create_nothing(kwargs, message):
    with pytest.raises(api.RecoveryValidationError, match=message):
        api.lease_acquire(**{"key": KEY, "holder": "w1", "ttl": 30, **kwargs})
    assert not Lease.objects.exists()


@pytest.mark.parametrize("ttl", [0, -5])
def test_renew_with_a_bad_ttl_is_refused_and_keeps_the_expiry(ttl):
    fence = api.lease_acquire(key=KEY, holder="w1", ttl=30)
    before = lease_row()
    with pytest.raises(api.RecoveryValidationError, match="ttl must be in"):
        api.lease_renew(fence=fence, ttl=ttl)
    assert lease_row() == before


def test_lease_expire_ends_a_dead_holders_lease_and_the_next_holder_gets_fence_plus_one():
    dead = api.lease_acquire(key=KEY, holder="dead", ttl=3600)
    assert api.lease_expire(fence=dead) is True
    row = Lease.objects.get(key=KEY)
    assert (row.holder, row.fence) == ("dead", dead.fence), "expired, not released"
    with pytest.raises(api.StaleFence):
        api.lease_renew(fence=dead, ttl=30)
    new = api.lease_acquire(key=KEY, holder="new", ttl=30)
    assert new.fence == dead.fence + 1
    # The dead holder's fence is no authority over the new lease: nothing changes.
    assert api.lease_expire(fence=dead) is False
    assert api.lease_renew(fence=new, ttl=30) == new


# --- checks --------------------------------------------------------------------------


def test_requiring_a_live_fence_refuses_a_stale_one_with_what_was_refused():
    old = api.lease_acquire(key=KEY, holder="w1", ttl=30)
    api.lease_require_live(fence=old, doing="fire timers")
    api.lease_release(fence=old)
    api.lease_acquire(key=KEY, holder="w2", ttl=30)
    with pytest.raises(api.StaleFence, match=r"Cannot fire timers: .* no longer the live lease"):
        api.lease_require_live(fence=old, doing="fire timers")
