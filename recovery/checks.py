"""System checks: the chain keys must parse, production must not use the dev key, and the
anchor store must be writable."""

from __future__ import annotations

from django.core import checks

from .anchors import anchor_store
from .errors import AnchorStoreError, ChainKeyError
from .keys import chain_keys

RECOVERY = "recovery"
"""The tag of the recovery core's checks: a project can run them, and only them, by tag
(GovFlow's ``qcluster`` runs every tagged check but the web's)."""


@checks.register(checks.Tags.security, RECOVERY)
def check_chain_keys(app_configs, **kwargs):
    try:
        chain_keys()
    except ChainKeyError as exc:
        return [checks.Error(str(exc), hint="Fix RECOVERY_CHAIN_KEYS.", id="recovery.E001")]
    return []


@checks.register(checks.Tags.security, RECOVERY, deploy=True)
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


@checks.register(RECOVERY)
def check_input_limits(app_configs, **kwargs):
    """The input guard's and the evidence limits are positive integers that fit together."""
    from django.conf import settings

    from .canonical import DEFAULT_INPUT_MAX_DEPTH, ENCODER_MAX_DEPTH

    mib = 1024 * 1024
    limits = {
        "RECOVERY_INPUT_MAX_DEPTH": (DEFAULT_INPUT_MAX_DEPTH, ENCODER_MAX_DEPTH),
        "RECOVERY_EVIDENCE_MAX_BYTES": (20 * mib, None),
        "RECOVERY_EVIDENCE_MAX_TOTAL_BYTES": (50 * mib, None),
    }
    found = []
    values = {}
    for name, (default, highest) in limits.items():
        value = values[name] = getattr(settings, name, default)
        if type(value) is not int or value < 1 or (highest is not None and value > highest):
            found.append(
                checks.Error(
                    f"{name} is {value!r}; it must be a positive integer"
                    + (f" of at most {highest}" if highest is not None else "")
                    + ".",
                    hint="Fix the setting; the input guard cannot protect the interpreter "
                    "or the disk with it."
                    if highest is not None
                    else "Fix the setting.",
                    id="recovery.E003",
                )
            )
    if not found and (
        values["RECOVERY_EVIDENCE_MAX_TOTAL_BYTES"] < values["RECOVERY_EVIDENCE_MAX_BYTES"]
    ):
        found.append(
            checks.Warning(
                "RECOVERY_EVIDENCE_MAX_TOTAL_BYTES is below RECOVERY_EVIDENCE_MAX_BYTES: a "
                "file of the largest accepted size can never be uploaded.",
                hint="Make the per-request total at least the per-file limit.",
                id="recovery.W001",
            )
        )
    return found


@checks.register(RECOVERY)
def check_anchor_store(app_configs, **kwargs):
    try:
        store = anchor_store()
    except AnchorStoreError as exc:
        return [checks.Warning(str(exc), id="recovery.W002")]
    if store is None:
        return [
            checks.Warning(
                "Anchors are turned off (RECOVERY_ANCHOR_STORE is empty): a truncated chain "
                "or a database restored from an older backup goes unnoticed.",
                hint="Remove the setting to anchor to a file in the var directory, or name "
                "a store for write-once storage (docs/recovery.md, 'Anchors').",
                id="recovery.W003",
            )
        ]
    return [
        checks.Warning(
            problem,
            hint="Until anchors can be appended, nothing is anchored and the sweeper logs "
            "an error at every try. Make the path writable by every GovFlow process, or set "
            "GOVFLOW_ANCHOR_PATH (RECOVERY_ANCHOR_PATH) to a writable place.",
            id="recovery.W002",
        )
        for problem in store.problems()
    ]
