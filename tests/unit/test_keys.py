"""Derived keys: operation keys, idempotency keys and the chain's keyed-hash keys."""

from __future__ import annotations

import re

import pytest
from blake3 import blake3

from recovery.api import (
    ChainKeyError,
    EmptyNonce,
    RecoveryValidationError,
    idempotency_key,
    operation_key,
)
from recovery.keys import chain_keys, parse_chain_keys

PARTS = {
    "definition_fp": "d" * 64,
    "step_id": "pay-fee",
    "action": "demo.fee",
    "input_fp": "e" * 64,
    "nonce": "instance-42:3:0",
}
HEX_A = "aa" * 32
HEX_B = "0123456789abcdef" * 4


# --- operation keys --------------------------------------------------------------------


def test_the_same_parts_always_give_the_same_operation_key():
    first = operation_key(**PARTS)
    assert operation_key(**dict(reversed(PARTS.items()))) == first
    assert re.fullmatch(r"op-[0-9a-f]{64}", first)


def test_a_compensation_key_has_its_own_prefix_and_never_equals_the_operation_key():
    forward = operation_key(**PARTS)
    compensation = operation_key(**PARTS, compensation=True)
    assert re.fullmatch(r"cmp-[0-9a-f]{64}", compensation)
    assert compensation != forward
    assert operation_key(**PARTS, compensation=True) == compensation


@pytest.mark.parametrize("part", list(PARTS))
def test_changing_any_single_part_changes_the_operation_key(part):
    changed = {**PARTS, part: PARTS[part][:-1] + ("x" if PARTS[part][-1] != "x" else "y")}
    assert operation_key(**changed) != operation_key(**PARTS)
    assert idempotency_key(**changed) != idempotency_key(**PARTS)


def test_moving_characters_between_parts_changes_the_key():
    # The parts are encoded as a JSON array, not joined: neither plain concatenation
    # ("pay"+"fee" = "payf"+"ee") nor a separator ("a:b"+"c" = "a"+"b:c") can collide.
    splits = [("pay", "fee"), ("payf", "ee"), ("pay:x", "fee"), ("pay", "x:fee")]
    keys = {
        operation_key(**{**PARTS, "step_id": step, "action": action}) for step, action in splits
    }
    assert len(keys) == len(splits)


def test_an_attempt_in_the_nonce_gives_each_retry_a_new_operation_key():
    attempts = {operation_key(**{**PARTS, "nonce": f"instance-42:3:{n}"}) for n in range(5)}
    assert len(attempts) == 5


@pytest.mark.parametrize("nonce", ["", " ", "\t\n ", None], ids=repr)
def test_an_empty_or_blank_nonce_is_refused(nonce):
    with pytest.raises(EmptyNonce, match="non-empty durable nonce"):
        operation_key(**{**PARTS, "nonce": nonce})
    with pytest.raises(EmptyNonce):
        idempotency_key(**{**PARTS, "nonce": nonce})


def test_empty_nonce_is_a_validation_error():
    assert issubclass(EmptyNonce, RecoveryValidationError)


@pytest.mark.parametrize("part", ["definition_fp", "step_id", "action", "input_fp"])
@pytest.mark.parametrize("bad", ["", None, 7])
def test_an_empty_or_non_string_part_is_refused_naming_it(part, bad):
    with pytest.raises(RecoveryValidationError, match=f"{part} must be a non-empty string"):
        operation_key(**{**PARTS, part: bad})


# --- idempotency keys ------------------------------------------------------------------


def test_idempotency_key_is_stable_and_never_the_operation_key_for_the_same_parts():
    idem = idempotency_key(**PARTS)
    assert idempotency_key(**PARTS) == idem
    assert re.fullmatch(r"idem-[0-9a-f]{64}", idem)
    # Different domain, not just a different prefix: the digests differ too.
    assert idem.removeprefix("idem-") != operation_key(**PARTS).removeprefix("op-")


def test_same_nonce_without_attempt_keeps_the_idempotency_key_across_retries():
    # The caller leaves the attempt out of the idempotency nonce and puts it in the
    # operation nonce: every retry is a new operation carrying the same provider key.
    idem_nonce = "instance-42:3"
    ops = {operation_key(**{**PARTS, "nonce": f"{idem_nonce}:{n}"}) for n in range(3)}
    idems = {idempotency_key(**{**PARTS, "nonce": idem_nonce}) for _ in range(3)}
    assert len(ops) == 3
    assert len(idems) == 1


# --- chain keys ------------------------------------------------------------------------


def test_chain_keys_parse_and_the_first_entry_is_active():
    keys = parse_chain_keys(f" k2:{HEX_A} , k.1_old-x:{HEX_B.upper()}", secret_key="s")
    assert keys.active_id == "k2"
    assert keys.keys == {"k2": bytes.fromhex(HEX_A), "k.1_old-x": bytes.fromhex(HEX_B)}
    assert keys.get("k.1_old-x") == bytes.fromhex(HEX_B)
    assert keys.get("missing") is None


def test_a_single_chain_key_is_active():
    keys = parse_chain_keys(f"only:{HEX_B}", secret_key="s")
    assert (keys.active_id, list(keys.keys)) == ("only", ["only"])


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param(HEX_A, "is not 'id:hex'", id="no-colon"),
        pytest.param(f":{HEX_A}", "is not 'id:hex'", id="empty-id"),
        pytest.param(f"bad id:{HEX_A}", "Key ids are 1-32 letters", id="space-in-id"),
        pytest.param(f"{'k' * 33}:{HEX_A}", "Key ids are 1-32 letters", id="id-too-long"),
        pytest.param(f"k/1:{HEX_A}", "is not 'id:hex'", id="slash-in-id"),
        pytest.param(f"k1:{HEX_A},", "'' is not 'id:hex'", id="trailing-comma"),
        pytest.param(f"k1:{HEX_A[:-2]}", "must be 64 hexadecimal characters", id="too-short"),
        pytest.param(f"k1:{HEX_A}00", "must be 64 hexadecimal characters", id="too-long"),
        pytest.param("k1:", "must be 64 hexadecimal characters", id="empty-key"),
        pytest.param(f"k1:{'zz' * 32}", "must be 64 hexadecimal characters", id="non-hex"),
        pytest.param(f"k1:{HEX_A[:-1]}", "must be 64 hexadecimal characters", id="odd-length"),
        pytest.param(f"k1:{HEX_A},k1:{HEX_B}", "'k1' appears twice", id="duplicate-id"),
    ],
)
def test_a_malformed_chain_key_entry_is_refused_with_a_helpful_message(raw, message):
    with pytest.raises(ChainKeyError, match=re.escape(message)):
        parse_chain_keys(raw, secret_key="s")


def test_a_wrong_length_key_error_says_how_to_generate_one():
    with pytest.raises(ChainKeyError, match=r"k1.*secrets\.token_hex\(32\)"):
        parse_chain_keys("k1:abcd", secret_key="s")


@pytest.mark.parametrize("raw", ["", "   ", None])
def test_no_chain_keys_derive_a_dev_key_from_the_secret_key(raw):
    keys = parse_chain_keys(raw, secret_key="my-secret")
    assert keys.active_id == "dev"
    assert list(keys.keys) == ["dev"]
    dev = keys.get("dev")
    assert len(dev) == 32
    assert dev == blake3(b"my-secret", derive_key_context="recovery chain dev key v1").digest()
    assert parse_chain_keys("", secret_key="my-secret").get("dev") == dev
    assert parse_chain_keys("", secret_key="other-secret").get("dev") != dev


def test_chain_keys_are_read_from_settings_when_asked(settings):
    settings.RECOVERY_CHAIN_KEYS = f"live:{HEX_B},old:{HEX_A}"
    assert chain_keys().active_id == "live"
    settings.RECOVERY_CHAIN_KEYS = ""
    settings.SECRET_KEY = "rotated-secret"
    keys = chain_keys()
    assert keys.active_id == "dev"
    assert keys.get("dev") == parse_chain_keys("", secret_key="rotated-secret").get("dev")
    settings.RECOVERY_CHAIN_KEYS = "broken"
    with pytest.raises(ChainKeyError):
        chain_keys()
