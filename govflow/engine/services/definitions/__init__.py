"""Publishing definitions: validate, freeze, fingerprint; and re-hashing them at run time.

A published definition is pinned twice: its document, and the contract of every action it
uses as the providers declared it then (:mod:`govflow.engine.contracts`). Its fingerprint
covers both. A run re-hashes the stored bytes (:func:`instance_pinned`) and compares them
with the instance's pin, and compares the pinned contracts with the registry
(:func:`pinned_contracts_refusal`): a definition changed in the database, or an action
changed by a provider's release, stops the instance with the reason, before anything is
dispatched. ``docs/adr/0008-definitions-pinned-with-their-actions.md`` says why.

Two modules: :mod:`.publish` publishes (from a document or a file); :mod:`.pinned` reads a
published definition back, re-hashed, and says why an instance of it must not run.
Import from this package.
"""

from .pinned import (
    Pinned,
    contract_drift,
    definitions_drifted,
    definitions_unresolved,
    instance_pinned,
    integrity_problem,
    pinned_contracts_refusal,
    pinned_definition_refusal,
    pinned_of,
    pinned_select,
    pinned_width,
    spec_of,
    start_refusal,
    trusted_spec,
    unresolved_reason,
)
from .publish import (
    app_workflow_files,
    definition_load_file,
    definition_publish,
    definitions_load_app_workflows,
)

__all__ = [
    "Pinned",
    "app_workflow_files",
    "contract_drift",
    "definition_load_file",
    "definition_publish",
    "definitions_drifted",
    "definitions_load_app_workflows",
    "definitions_unresolved",
    "instance_pinned",
    "integrity_problem",
    "pinned_contracts_refusal",
    "pinned_definition_refusal",
    "pinned_of",
    "pinned_select",
    "pinned_width",
    "spec_of",
    "start_refusal",
    "trusted_spec",
    "unresolved_reason",
]
