"""A linked run's start recorded: the start step completes and a watch step begins.

A ``linked_run`` node takes two steps (tokens). The first is the start: dispatched like
a non-atomic action (ledger before dispatch, fences; an uncertain start is
``outcome_unknown`` with the usual handoff). Whatever settles it — the provider's
answer, its reconcile, or an operator's approved *effect confirmed* — goes through
``settle.complete_with_output``, which hands a linked run's start to :func:`watch_begin`
here instead of routing on: the start completes, and a watch step at the same node
becomes ready, with the run's reference kept beside it (``LinkedRun``). The watch step
only asks for the run's descriptor (``services.linked``).
"""

from __future__ import annotations

from typing import Any

from recovery.api import FingerprintKind, fact_append, fingerprint_value

from ..db import clock
from ..linked import run_providers
from ..models import LinkedRun, Token, TokenState, WaitKind
from .routing import Router, after_seconds
from .run import Run

__all__ = ["is_linked_start", "watch_begin"]


def is_linked_start(node, token: Token) -> bool:
    """Whether ``token`` is the start step of a linked run (not its watch step). Pure."""
    return node.get("type") == "linked_run" and token.wait_kind != WaitKind.LINKED


def watch_begin(
    run: Run,
    token: Token,
    node,
    output: dict[str, Any],
    *,
    expected: str,
    reason: str = "",
    extra=None,
) -> None:
    """The start of a linked run succeeded (or was confirmed): complete it and begin to
    watch the run (needs the caller's commit).

    The watch step carries the start's idempotency and operation keys (one logical run);
    its first look is after the provider's ``poll_backoff``. A ``linked_run.started``
    fact puts the run's reference (its fingerprint) on the instance's chain.
    """
    ref = str(output.get("run", ""))
    provider = run_providers.get(node["run_provider"])
    first = provider.poll_backoff if provider is not None else 5.0
    run.update_token(
        token,
        expected,
        state=TokenState.COMPLETED,
        reason=reason or f"Started run {ref[:200]} in {node['run_provider']}.",
        **(extra or {}),
    )
    run.active.pop(token.pk, None)
    router = Router(run)
    watch = router.new_token(
        token.node_id,
        TokenState.READY,
        wait_kind=WaitKind.LINKED,
        operation_key=token.operation_key,
        idempotency_key=token.idempotency_key,
    )
    run.flush(router)
    # Inserted as plain values; the first look's due time is the database clock's.
    run.update_token(
        watch,
        TokenState.READY,
        not_before=after_seconds(first),
        reason=f"Watching run {ref[:200]} in {node['run_provider']}; first look in {first:g} s.",
    )
    _link_record(run, token, watch, node, ref)


def _link_record(run: Run, token: Token, watch: Token, node, ref: str) -> None:
    """The run's row and its ``linked_run.started`` fact (needs the caller's commit)."""
    LinkedRun.objects.create(
        instance_id=run.instance.pk,
        start_token_id=token.pk,
        watch_token_id=watch.pk,
        node_id=token.node_id,
        provider=node["run_provider"],
        run_ref=ref[:200],
        operation_key=token.operation_key,
        started_at=clock(),
    )
    fact_append(
        subject=run.subject,
        kind="linked_run.started",
        fact={
            "step": token.node_id,
            "provider": node["run_provider"],
            "run_fp": fingerprint_value(FingerprintKind.RESULT, {"run": ref}),
            "start_token": token.pk,
            "watch_token": watch.pk,
        },
    )
