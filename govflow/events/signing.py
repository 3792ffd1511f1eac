"""Signing secrets and signatures of webhook deliveries (ADR 0032).

A subscription's secret must be at hand to sign every delivery, so it cannot be stored
as a hash like an API key. It is not stored at all: it is *derived*, when needed, as the
keyed BLAKE3 hash of a random salt under a server key from ``GOVFLOW_WEBHOOK_KEYS``, and
the subscription stores only the salt and the key's id. The secret is shown once, when
it is made; a database dump alone does not reveal it, and a new salt (rotation) makes a
new one. Keys rotate like the chain's: new secrets use the first key, older ones keep
theirs while its id stays listed.

The signature is HMAC-SHA256 over ``<timestamp>.<body>`` with the secret, sent as
``GovFlow-Signature: v1=<hex>`` beside ``GovFlow-Timestamp`` (docs/integrations.md).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets as random

import blake3
from django.conf import settings

from .conf import KEYS

__all__ = ["SecretUnavailable", "new_salt", "secret_of", "signature"]

DEFAULT_KEY_ID = "secret-key"
_CONTEXT = "GovFlow 2026-12 webhook signing secrets"


class SecretUnavailable(Exception):
    """The key a subscription's secret was derived from is no longer configured."""


def _keys() -> dict[str, bytes]:
    """The configured keys, first the one for new secrets (insertion order)."""
    text = KEYS.value().strip()
    if not text:
        derived = blake3.blake3(settings.SECRET_KEY.encode(), derive_key_context=_CONTEXT).digest()
        return {DEFAULT_KEY_ID: derived}
    keys: dict[str, bytes] = {}
    for item in text.split(","):
        key_id, _, hex_key = item.strip().partition(":")
        keys[key_id] = bytes.fromhex(hex_key)
    return keys


def keys_problem() -> str:
    """What is wrong with ``GOVFLOW_WEBHOOK_KEYS``, or '' (a system check asks)."""
    text = KEYS.value().strip()
    for item in filter(None, (part.strip() for part in text.split(","))):
        key_id, sep, hex_key = item.partition(":")
        try:
            raw = bytes.fromhex(hex_key)
        except ValueError:
            raw = b""
        if not sep or not key_id or len(key_id) > 32 or len(raw) != 32:
            return (
                f"GOVFLOW_WEBHOOK_KEYS: {item[:40]!r} is not 'id:<64 hex characters>'. "
                "Give each key an id of at most 32 characters and 32 random bytes in hex "
                "(python -c 'import secrets; print(secrets.token_hex(32))')."
            )
    return ""


def new_salt() -> tuple[str, str]:
    """A fresh salt and the id of the key its secret is derived from."""
    key_id = next(iter(_keys()))
    return random.token_hex(32), key_id


def secret_of(salt: str, key_id: str) -> str:
    """The signing secret derived from ``salt`` under the key ``key_id``."""
    key = _keys().get(key_id)
    if key is None:
        raise SecretUnavailable(
            f"The key {key_id!r} this subscription's secret was derived from is no longer "
            "in GOVFLOW_WEBHOOK_KEYS: put it back, or give the subscription a new secret."
        )
    return "whsec_" + blake3.blake3(bytes.fromhex(salt), key=key).hexdigest()


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """HMAC-SHA256 over ``<timestamp>.<body>``, hex."""
    message = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
