"""A sealed mark (ADR 0066): it unseals for its own subject under a chain key it names,
and for nothing else; only operations that can still move are sealed."""

from __future__ import annotations

import dataclasses

import pytest

from recovery.chain import Mark, Seal, compute_link, seal, unseal
from recovery.keys import chain_keys
from recovery.subjects import Subject

SUBJECT = Subject("govflow.instance", "7")
OPEN = {"state": "dispatched", "revision": 1, "result_fp": "", "chain_seq": 3}
DONE = {"state": "succeeded", "revision": 2, "result_fp": "f" * 64, "chain_seq": 4}


@pytest.fixture(autouse=True)
def _keys(settings):
    settings.RECOVERY_CHAIN_KEYS = f"k2:{'22' * 32},k1:{'11' * 32}"


def mark() -> Mark:
    return Mark(SUBJECT, 4, "a" * 64, {"op-open": dict(OPEN), "op-done": dict(DONE)})


def test_a_seal_unseals_to_its_mark_with_the_open_operations_only():
    sealed = seal(mark())
    assert sealed.key_id == "k2"  # the active key
    unsealed = unseal(SUBJECT, sealed)
    assert (unsealed.subject, unsealed.seq, unsealed.link) == (SUBJECT, 4, "a" * 64)
    assert unsealed.ops == {"op-open": OPEN}
    assert unsealed.stored == 4 and unsealed.written == []


@pytest.mark.parametrize(
    "change",
    [
        {"seq": 5},
        {"link": "b" * 64},
        {"ops": '{"op-open":{"state":"succeeded"}}'},
        {"ops": "{}"},
        {"mac": "0" * 64},
        {"key_id": "k1"},  # another known key: the MAC was not made with it
        {"key_id": "gone"},  # a key no longer configured
    ],
)
def test_a_seal_changed_in_any_column_unseals_to_nothing(change):
    assert unseal(SUBJECT, dataclasses.replace(seal(mark()), **change)) is None


def test_a_seal_is_its_subjects_alone():
    sealed = seal(mark())
    assert unseal(Subject("govflow.instance", "8"), sealed) is None
    assert unseal(Subject("other.kind", "7"), sealed) is None


def test_a_seal_made_under_a_retired_key_unseals_while_the_key_is_configured(settings):
    settings.RECOVERY_CHAIN_KEYS = f"k1:{'11' * 32}"
    sealed = seal(mark())
    settings.RECOVERY_CHAIN_KEYS = f"k2:{'22' * 32},k1:{'11' * 32}"
    assert unseal(SUBJECT, sealed) is not None
    settings.RECOVERY_CHAIN_KEYS = f"k2:{'22' * 32}"
    assert unseal(SUBJECT, sealed) is None


def test_a_seal_is_not_a_link_under_the_same_key():
    """The seal's key is derived from the chain key, never the chain key itself."""
    sealed = seal(mark())
    key = chain_keys().get("k2")
    as_link = compute_link(key, SUBJECT, 4, "mark", sealed.ops, "a" * 64)
    assert sealed.mac != as_link
    assert Seal.of_row((4, None, sealed.ops, sealed.mac, None, "a" * 64, "k2", None)) == sealed
