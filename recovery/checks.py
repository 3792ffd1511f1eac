"""System checks: the chain keys must parse, and production must not use the dev key."""

from __future__ import annotations

from django.core import checks

from .errors import ChainKeyError
from .keys import chain_keys


@checks.register(checks.Tags.security)
def check_chain_keys(app_configs, **kwargs):
    try:
        chain_keys()
    except ChainKeyError as exc:
        return [checks.Error(str(exc), hint="Fix RECOVERY_CHAIN_KEYS.", id="recovery.E001")]
    return []


@checks.register(checks.Tags.security, deploy=True)
def check_chain_keys_deploy(app_configs, **kwargs):
    try:
        keys = chain_keys()
    except ChainKeyError:
        return []  # reported by recovery.E001
    if keys.derived:
        return [
            checks.Error(
                "The checkpoint chain uses a key derived from SECRET_KEY (development mode).",
                hint="Set GOVFLOW_CHAIN_KEYS (the RECOVERY_CHAIN_KEYS setting) to "
                "'id:64-hex-chars' from a secret store.",
                id="recovery.E002",
            )
        ]

    return []
