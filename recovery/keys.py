"""Derived keys: operation keys, provider idempotency keys, and the chain's keyed-hash keys.

Keys are derived, never invented: the same logical invocation always gets the same key,
on any host, after any restart.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from blake3 import blake3

from .canonical import FingerprintKind, canonical_bytes, fingerprint
from .errors import ChainKeyError, EmptyNonce, RecoveryValidationError
from .kept import kept_setting

__all__ = ["ChainKeys", "chain_keys", "idempotency_key", "operation_key"]

OPERATION_PREFIX = "op-"
COMPENSATION_PREFIX = "cmp-"


def _parts(definition_fp: str, step_id: str, action: str, input_fp: str, nonce: str) -> bytes:
    if not isinstance(nonce, str) or not nonce.strip():
        raise EmptyNonce(
            "An operation key needs a non-empty durable nonce (for example instance id, "
            "step ordinal and attempt); without one two invocations would share a key."
        )
    for name, value in (
        ("definition_fp", definition_fp),
        ("step_id", step_id),
        ("action", action),
        ("input_fp", input_fp),
    ):
        if not isinstance(value, str) or not value:
            raise RecoveryValidationError(f"{name} must be a non-empty string.")
    # Strings, checked above: the walk would find nothing the encoding does not.
    return canonical_bytes([definition_fp, step_id, action, input_fp, nonce], admitted=True)


def operation_key(
    *,
    definition_fp: str,
    step_id: str,
    action: str,
    input_fp: str,
    nonce: str,
    compensation: bool = False,
) -> str:
    """Return the operation key of one invocation boundary (``op-…`` or ``cmp-…``).

    ``nonce`` is durable and unique per invocation: instance id, step ordinal and the
    attempt or poll ordinal. An empty nonce raises :class:`~recovery.errors.EmptyNonce`.
    """
    digest = fingerprint(
        FingerprintKind.OPERATION_KEY, _parts(definition_fp, step_id, action, input_fp, nonce)
    )
    return (COMPENSATION_PREFIX if compensation else OPERATION_PREFIX) + digest


def idempotency_key(
    *, definition_fp: str, step_id: str, action: str, input_fp: str, nonce: str
) -> str:
    """Return the provider idempotency key of one logical effect.

    Its ``nonce`` leaves out the attempt: every poll and every deliberate retry of the same
    logical effect passes the same key to the provider. The ledger stores only its
    fingerprint (kind ``idempotency-key``).
    """
    digest = fingerprint(
        FingerprintKind.IDEMPOTENCY_KEY, _parts(definition_fp, step_id, action, input_fp, nonce)
    )
    return "idem-" + digest


@dataclass(frozen=True)
class ChainKeys:
    """The active chain key and every key that still verifies older checkpoints."""

    active_id: str
    keys: dict[str, bytes]
    derived: bool = False
    """True when the key was derived from SECRET_KEY (development only)."""

    def get(self, key_id: str) -> bytes | None:
        return self.keys.get(key_id)


_KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,32}\Z")


def parse_chain_keys(raw: str, *, secret_key: str) -> ChainKeys:
    """Parse ``"id:64hex,id:64hex"``; the first pair is the active key.

    An empty value derives a development key (id ``dev``) from ``secret_key``. Production
    settings refuse to start without explicit keys.
    """
    raw = (raw or "").strip()
    if not raw:
        key = blake3(secret_key.encode(), derive_key_context="recovery chain dev key v1").digest()
        return ChainKeys(active_id="dev", keys={"dev": key}, derived=True)
    keys: dict[str, bytes] = {}
    order: list[str] = []
    for item in raw.split(","):
        key_id, sep, hex_key = item.strip().partition(":")
        if not sep or not _KEY_ID.match(key_id):
            raise ChainKeyError(
                f"Chain key entry {item.strip()!r} is not 'id:hex'. Key ids are 1-32 "
                "letters, digits, '.', '_' or '-'."
            )
        try:
            key = bytes.fromhex(hex_key)
        except ValueError:
            key = b""
        if len(key) != 32:
            raise ChainKeyError(
                f"Chain key {key_id!r} must be 64 hexadecimal characters (32 bytes); "
                "generate one with: python -c 'import secrets; print(secrets.token_hex(32))'."
            )
        if key_id in keys:
            raise ChainKeyError(f"Chain key id {key_id!r} appears twice.")
        keys[key_id] = key
        order.append(key_id)
    return ChainKeys(active_id=order[0], keys=keys)


@functools.lru_cache(maxsize=8)
def _cached(raw: str, secret_key: str) -> ChainKeys:
    return parse_chain_keys(raw, secret_key=secret_key)


def chain_keys() -> ChainKeys:
    """Return the chain keys from settings (kept until a setting changes, so tests can
    override them)."""
    return _cached(kept_setting("RECOVERY_CHAIN_KEYS", ""), kept_setting("SECRET_KEY"))
