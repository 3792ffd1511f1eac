"""Action contracts and the fingerprint of a definition pinned with them (no database)."""

from __future__ import annotations

import dataclasses

from govflow.engine.contracts import (
    action_contract,
    contract_changes,
    pinned_fingerprint,
    stored_fingerprint,
)
from govflow.engine.registry import VerificationCheck
from recovery.api import FingerprintKind, canonical_bytes, fingerprint
from tests.providers.alpha import actions as alpha

DOCUMENT = {"key": "tests.unit", "version": 1, "title": "Ünïcode", "nodes": [], "transitions": []}


def test_hashing_the_stored_texts_equals_hashing_the_published_values():
    contracts = {"alpha.write": action_contract(alpha.write)}
    stored = stored_fingerprint(
        canonical_bytes(DOCUMENT).decode(), canonical_bytes(contracts).decode()
    )
    assert stored == pinned_fingerprint(DOCUMENT, contracts)


def test_any_byte_of_the_stored_texts_changes_the_hash():
    contracts = canonical_bytes({"alpha.write": action_contract(alpha.write)}).decode()
    document = canonical_bytes(DOCUMENT).decode()
    pinned = stored_fingerprint(document, contracts)
    assert stored_fingerprint(document + " ", contracts) != pinned
    assert stored_fingerprint(document, contracts.replace("non_atomic", "atomic")) != pinned
    assert stored_fingerprint(document, "") != pinned


def test_a_definition_without_pinned_contracts_hashes_its_document_alone():
    document = canonical_bytes(DOCUMENT).decode()
    assert stored_fingerprint(document, "") == fingerprint(
        FingerprintKind.DEFINITION, document.encode()
    )


def test_what_is_pinned_and_what_is_not():
    pinned = action_contract(alpha.write)
    assert pinned["mode"] == "non_atomic" and pinned["checks"] == ["store"]
    same = dataclasses.replace(alpha.write, title="Other", retry_budget=0, poll=None)
    assert action_contract(same) == pinned
    for changed in (
        {"recovery_mode": "atomic"},
        {"checks": (VerificationCheck("store", "Other words."),)},
        {"input_schema": {"type": "object"}},
    ):
        assert action_contract(dataclasses.replace(alpha.write, **changed)) != pinned


def test_what_changed_is_said_in_words():
    pinned = action_contract(alpha.write)
    changed = action_contract(
        dataclasses.replace(
            alpha.write,
            recovery_mode="irreversible",
            checks=(VerificationCheck("ledger", "Ask the ledger office."),),
            input_schema={"type": "object"},
        )
    )
    assert contract_changes("alpha.write", pinned, changed) == (
        "alpha.write: recovery mode was non_atomic, is now irreversible, verification checks "
        "changed (added ledger; removed store), input schema changed"
    )
    assert contract_changes("alpha.write", pinned, pinned) == ""
