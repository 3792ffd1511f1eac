"""Gateways, parallel branches, timers, trigger messages and human approvals."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from govflow.engine.errors import EngineConflict, InvalidRequest, NotPermitted
from govflow.engine.models import (
    Incident,
    Instance,
    InstanceStatus,
    Timer,
    TokenState,
    TriggerDelivery,
    WaitKind,
)
from govflow.engine.provider import Pending
from govflow.engine.services.runtime import instance_run
from govflow.engine.services.sweep import SWEEPER, deliveries_retry
from govflow.engine.services.timers import timers_fire
from govflow.engine.services.triggers import trigger_deliver
from govflow.handoffs.services.desk import approval_decide, external_complete
from recovery import api
from tests.dbclock import db_now
from tests.engine_helpers import (
    chain_ok,
    graph,
    make_due,
    node,
    op_states,
    token_of,
    token_states,
    user_with,
)
from tests.flows import action, drive, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db


def gateway(*, default: bool = True, before: list | None = None):
    """start → [before…] → g → a (fee > 100) | b (default) → end."""
    before = before or []
    ids = ["s", *[n["id"] for n in before], "g"]
    branches = [("g", "a", {"var": "fee", "op": "gt", "value": 100}), ("a", "e")]
    if default:
        branches += [("g", "b", "default"), ("b", "e")]
    return graph(
        [
            node("s", "start"),
            *before,
            node("g", "exclusive"),
            action("a"),
            *([action("b")] if default else []),
            node("e", "end"),
        ],
        [*itertools.pairwise(ids), *branches],
    )


def test_exclusive_gateway_takes_the_branch_whose_condition_holds():
    instance = drive(start(gateway(), {"value": "v1", "fee": 150}))
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert token_states(instance) == {"s": "completed", "a": "completed"}


def test_exclusive_gateway_takes_the_default_branch_when_nothing_matches():
    instance = drive(start(gateway(), {"value": "v1", "fee": 50}))
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert token_states(instance) == {"s": "completed", "b": "completed"}


def test_gateway_without_a_match_or_default_blocks_with_a_clear_reason():
    instance = drive(start(gateway(default=False), {"value": "v1", "fee": 50}))
    assert instance.status == InstanceStatus.BLOCKED
    assert instance.reason == (
        "The workflow cannot continue: gateway 'g': no condition "
        "matches the variables and there is no default branch."
    )
    assert list(Incident.objects.values_list("kind", flat=True)) == ["route"]
    for _ in range(2):
        instance_run(instance_id=instance.pk)
    assert Incident.objects.count() == 1, "blocking again for the same reason adds nothing"
    assert effects.call_count() == 0


def test_gateway_without_a_match_after_a_step_keeps_the_steps_success():
    # The provider answered: its success is a fact, not an unknown outcome.
    instance = drive(
        start(gateway(default=False, before=[action("pay")]), {"value": "v1", "fee": 50})
    )
    assert instance.status == InstanceStatus.BLOCKED
    assert "gateway 'g': no condition matches" in instance.reason
    assert token_of(instance, "pay").state == TokenState.COMPLETED
    assert op_states(instance) == ["succeeded"]
    assert instance.variables["pay"]["stored"] == "v1"
    assert drive(instance).status == InstanceStatus.BLOCKED
    assert op_states(instance) == ["succeeded"] and effects.call_count() == 1
    assert chain_ok(instance)


def test_conditions_combine_with_all_any_and_not():
    when = {
        "all": [
            {"var": "fee", "op": "ge", "value": 100},
            {
                "any": [
                    {"var": "kind", "op": "in", "value": ["shop", "bar"]},
                    {"not": {"var": "exempt", "op": "truthy"}},
                ]
            },
        ]
    }
    doc = graph(
        [node("s", "start"), node("g", "exclusive"), action("a"), action("b"), node("e", "end")],
        [("s", "g"), ("g", "a", when), ("g", "b", "default"), ("a", "e"), ("b", "e")],
        key="tests.conditions",
    )
    chosen = []
    for variables in (
        {"fee": 100, "kind": "bar", "exempt": True},
        {"fee": 100, "kind": "home", "exempt": True},
        {"fee": 100, "kind": "home"},
        {"fee": "lots", "kind": "bar"},
    ):
        instance = drive(start(doc, {"value": "v1", **variables}))
        chosen.append(next(n for n in token_states(instance) if n in "ab"))
    assert chosen == ["a", "b", "a", "b"]


@pytest.mark.parametrize(("variables", "taken"), [({}, "b"), ({"application_id": None}, "a")])
def test_exists_tells_a_missing_variable_from_a_null_one(variables, taken):
    doc = graph(
        [node("s", "start"), node("g", "exclusive"), action("a"), action("b"), node("e", "end")],
        [
            ("s", "g"),
            ("g", "a", {"var": "application_id", "op": "exists"}),
            ("g", "b", "default"),
            ("a", "e"),
            ("b", "e"),
        ],
        key="tests.exists",
    )
    instance = drive(start(doc, {"value": "v1", **variables}))
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert taken in token_states(instance)


def test_parallel_join_waits_for_every_branch():
    doc = graph(
        [
            node("s", "start"),
            node("split", "parallel_split"),
            action("a"),
            action("b"),
            node("join", "parallel_join"),
            action("c"),
            node("e", "end"),
        ],
        [
            ("s", "split"),
            ("split", "a"),
            ("split", "b"),
            ("a", "join"),
            ("b", "join"),
            ("join", "c"),
            ("c", "e"),
        ],
    )
    effects.SCRIPT["alpha.write"] = [Pending(poll_after=60)]  # branch a waits on its provider
    instance = drive(start(doc))
    assert instance.status == InstanceStatus.WAITING
    states = token_states(instance)
    assert states["a"] == TokenState.READY and states["b"] == TokenState.COMPLETED
    assert token_of(instance, "join").wait_kind == WaitKind.JOIN and "c" not in states
    make_due(token_of(instance, "a"))
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert set(token_states(instance).values()) == {TokenState.COMPLETED}
    assert instance.tokens.filter(node_id="c").count() == 1
    assert op_states(instance) == ["pending", "succeeded", "succeeded", "succeeded"]


def test_an_uncertain_branch_keeps_the_instance_blocked_while_the_other_branch_moves():
    doc = graph(
        [
            node("s", "start"),
            node("split", "parallel_split"),
            action("a"),
            action("b"),
            node("join", "parallel_join"),
            node("e", "end"),
        ],
        [
            ("s", "split"),
            ("split", "a"),
            ("split", "b"),
            ("a", "join"),
            ("b", "join"),
            ("join", "e"),
        ],
    )
    effects.SCRIPT["alpha.write"] = ["raise_after"]  # branch a runs first (lower ordinal)
    instance = drive(start(doc))
    states = token_states(instance)
    assert (states["a"], states["b"]) == (TokenState.OUTCOME_UNKNOWN, TokenState.COMPLETED)
    assert instance.status == InstanceStatus.BLOCKED
    assert instance.reason.startswith("Outcome unknown: ")


def test_a_rejected_branch_keeps_the_instance_blocked_while_the_other_branch_finishes():
    doc = graph(
        [
            node("s", "start"),
            node("split", "parallel_split"),
            action("a", value="count"),
            action("b"),
            node("join", "parallel_join"),
            node("e", "end"),
        ],
        [
            ("s", "split"),
            ("split", "a"),
            ("split", "b"),
            ("a", "join"),
            ("b", "join"),
            ("join", "e"),
        ],
    )
    instance = drive(start(doc, {"value": "v1", "count": 3}))
    states = token_states(instance)
    assert (states["a"], states["b"]) == (TokenState.READY, TokenState.COMPLETED)
    assert instance.status == InstanceStatus.BLOCKED
    assert "The input of step 'a' violates the schema of alpha.write" in instance.reason
    assert Incident.objects.filter(instance=instance).count() == 1


def sweeper() -> api.Fence:
    return api.lease_acquire(key=SWEEPER, holder="sweeper-1", ttl=30)


def test_timer_is_due_by_the_database_clock_and_fires_exactly_once(monkeypatch):
    instance = start(linear(node("t", "timer", duration="PT1H"), action("a")))
    # A worker whose clock is years off must not move the due time (I9).
    monkeypatch.setattr(timezone, "now", lambda: dt.datetime(2001, 1, 1, tzinfo=dt.UTC))
    before = db_now()
    instance = drive(instance)
    after = db_now()
    monkeypatch.undo()
    assert instance.status == InstanceStatus.WAITING
    timer = Timer.objects.get(instance=instance)
    assert before + dt.timedelta(hours=1) <= timer.due_at <= after + dt.timedelta(hours=1)
    assert token_of(instance, "t").wait_kind == WaitKind.TIMER
    fence = sweeper()
    assert timers_fire(fence=fence) == 0, "not due yet"
    Timer.objects.filter(pk=timer.pk).update(due_at=Now())  # an hour passes
    assert timers_fire(fence=fence) == 1
    assert timers_fire(fence=fence) == 0, "a fired timer never fires again"
    timer.refresh_from_db()
    assert (timer.state, timer.fire_fence) == ("fired", fence.fence)
    assert token_of(instance, "t").state == TokenState.READY
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert "t" not in instance.variables  # a timer writes no variables
    assert effects.call_count() == 1


def test_timer_at_a_past_moment_fires_on_the_first_sweep():
    instance = drive(start(linear(node("t", "timer", at="2020-01-01T09:00:00+01:00"))))
    assert Timer.objects.get(instance=instance).due_at == dt.datetime(2020, 1, 1, 8, tzinfo=dt.UTC)
    assert timers_fire(fence=sweeper()) == 1
    assert drive(instance).status == InstanceStatus.COMPLETED


def trigger_flow(**extra):
    return linear(
        node("w", "trigger", message="payment", correlation="case.id", output={"paid": "amount"}),
        action("a"),
        **extra,
    )


def test_trigger_delivery_advances_the_waiting_instance_with_its_payload():
    instance = drive(start(trigger_flow(), {"value": "v1", "case": {"id": "C-1"}}))
    assert instance.status == InstanceStatus.WAITING
    assert token_of(instance, "w").wait_key == "payment:C-1"
    delivery = trigger_deliver(
        message="payment", correlation="C-1", delivery_id="bank-1", payload={"amount": 12}
    )
    assert delivery.state == "consumed" and delivery.token == token_of(instance, "w")
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert instance.variables["paid"] == 12
    assert effects.call_count() == 1


def test_the_same_delivery_twice_is_one_message():
    instance = drive(start(trigger_flow(), {"value": "v1", "case": {"id": "C-1"}}))
    first = trigger_deliver(
        message="payment", correlation="C-1", delivery_id="bank-1", payload={"amount": 12}
    )
    drive(instance)
    again = trigger_deliver(
        message="payment", correlation="C-1", delivery_id="bank-1", payload={"amount": 12}
    )
    assert again.pk == first.pk and TriggerDelivery.objects.count() == 1
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED
    assert instance.tokens.filter(node_id="a").count() == 1 and effects.call_count() == 1


def test_the_same_delivery_id_with_other_content_is_refused():
    trigger_deliver(
        message="payment", correlation="C-1", delivery_id="bank-1", payload={"amount": 12}
    )
    with pytest.raises(EngineConflict, match="Delivery id 'bank-1' was already used"):
        trigger_deliver(
            message="payment", correlation="C-1", delivery_id="bank-1", payload={"amount": 13}
        )
    assert TriggerDelivery.objects.get().payload == {"amount": 12}


def test_a_message_that_arrives_first_waits_for_its_instance():
    early = trigger_deliver(
        message="payment", correlation="C-7", delivery_id="bank-7", payload={"amount": 30}
    )
    other = trigger_deliver(
        message="payment", correlation="C-8", delivery_id="bank-8", payload={"amount": 99}
    )
    assert early.state == "received" and early.token is None
    instance = drive(start(trigger_flow(), {"value": "v1", "case": {"id": "C-7"}}))
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert instance.variables["paid"] == 30
    early.refresh_from_db()
    other.refresh_from_db()
    assert (early.state, early.token) == ("consumed", token_of(instance, "w"))
    assert other.state == "received", "a message for another case stays buffered"


def _waiting_in(tenant: str, case: str) -> Instance:
    return drive(start(trigger_flow(), {"value": "v1", "case": {"id": case}}, tenant=tenant))


def test_a_message_for_a_tenant_is_never_handed_to_another_tenants_step():
    theirs = _waiting_in("south", "C-1")
    delivery = trigger_deliver(
        message="payment",
        correlation="C-1",
        delivery_id="north:bank-1",
        payload={"amount": 5},
        tenant="north",
    )
    assert (delivery.state, delivery.token) == ("received", None)
    assert deliveries_retry() == 0, "the sweep does not hand it across either"
    assert token_of(theirs, "w").state == TokenState.WAITING

    ours = _waiting_in("north", "C-1")
    assert ours.status == InstanceStatus.COMPLETED, ours.reason
    assert ours.variables["paid"] == 5
    delivery.refresh_from_db()
    assert delivery.token == token_of(ours, "w")
    assert drive(theirs).status == InstanceStatus.WAITING


def test_a_tenants_message_wakes_its_own_step_when_another_tenant_waits_first():
    theirs = _waiting_in("south", "C-2")
    ours = _waiting_in("north", "C-2")
    delivery = trigger_deliver(
        message="payment",
        correlation="C-2",
        delivery_id="n-2",
        payload={"amount": 7},
        tenant="north",
    )
    assert delivery.token == token_of(ours, "w")
    assert drive(ours).status == InstanceStatus.COMPLETED
    assert token_of(theirs, "w").state == TokenState.WAITING


def test_a_message_left_for_its_tenant_is_handed_over_by_the_sweep():
    theirs = _waiting_in("south", "C-3")
    ours = _waiting_in("north", "C-3")
    TriggerDelivery.objects.create(
        delivery_id="n-3",
        tenant="north",
        message="payment",
        correlation="C-3",
        payload={"amount": 9},
        received_at=db_now(),
    )  # as if its first hand-over had been interrupted
    assert deliveries_retry() == 1
    assert TriggerDelivery.objects.get(delivery_id="n-3").token == token_of(ours, "w")
    assert token_of(theirs, "w").state == TokenState.WAITING


def test_the_same_delivery_id_for_another_tenant_is_refused():
    trigger_deliver(message="payment", correlation="C-1", delivery_id="d-1", tenant="north")
    with pytest.raises(EngineConflict, match="already used for a different message"):
        trigger_deliver(message="payment", correlation="C-1", delivery_id="d-1", tenant="south")
    assert TriggerDelivery.objects.get().tenant == "north"


@pytest.mark.parametrize("payload", [[1, 2], {"amount": float("nan")}])
def test_a_malformed_message_is_refused(payload):
    with pytest.raises(InvalidRequest, match="payload"):
        trigger_deliver(message="payment", correlation="C-1", delivery_id="x", payload=payload)
    assert not TriggerDelivery.objects.exists()


def test_trigger_without_its_correlation_variable_blocks_with_the_reason():
    instance = drive(start(trigger_flow(), {"value": "v1"}))
    assert instance.status == InstanceStatus.BLOCKED
    assert instance.reason == (
        "The workflow cannot continue: trigger 'w': variable 'case.id' "
        "is not set; it identifies the awaited message."
    )


def approval_flow():
    return graph(
        [
            node("s", "start"),
            node("ok", "approval", permission="engine.operate_instance"),
            node("g", "exclusive"),
            action("a"),
            node("e", "end"),
        ],
        [
            ("s", "ok"),
            ("ok", "g"),
            ("g", "a", {"var": "ok.approved", "op": "eq", "value": True}),
            ("g", "e", "default"),
            ("a", "e"),
        ],
    )


def test_approval_needs_the_nodes_permission(django_user_model):
    clerk = user_with(django_user_model, "clerk")
    head = user_with(django_user_model, "head", "engine.operate_instance")
    instance = drive(start(approval_flow()))
    token = token_of(instance, "ok")
    assert (instance.status, token.wait_kind) == (InstanceStatus.WAITING, WaitKind.APPROVAL)
    with pytest.raises(NotPermitted, match=r"needs the permission 'engine\.operate_instance'"):
        approval_decide(instance_id=instance.pk, token_id=token.pk, actor=clerk, approved=True)
    assert token_of(instance, "ok").state == TokenState.WAITING
    approval_decide(
        instance_id=instance.pk, token_id=token.pk, actor=head, approved=True, note="Fine by me."
    )
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert instance.variables["ok"] == {"approved": True, "by": "head", "note": "Fine by me."}
    assert effects.call_count() == 1
    with pytest.raises(EngineConflict, match="is not waiting for an approval"):
        approval_decide(instance_id=instance.pk, token_id=token.pk, actor=head, approved=True)


def test_a_rejection_is_recorded_and_routes_on(django_user_model):
    head = user_with(django_user_model, "head", "engine.operate_instance")
    instance = drive(start(approval_flow()))
    approval_decide(
        instance_id=instance.pk, token_id=token_of(instance, "ok").pk, actor=head, approved=False
    )
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED
    assert instance.variables["ok"]["approved"] is False and effects.call_count() == 0


def test_external_task_completes_with_the_workers_result():
    instance = drive(start(linear(node("x", "external", topic="scan", output={"pages": "pages"}))))
    token = token_of(instance, "x")
    assert (token.wait_kind, token.wait_key) == (WaitKind.EXTERNAL, "scan")
    external_complete(instance_id=instance.pk, token_id=token.pk, payload={"pages": 4})
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED and instance.variables["pages"] == 4


def test_a_branch_whose_route_failed_keeps_the_instance_from_completing_later():
    """Branch a completes but cannot route on; branch b reaches the end in a later run.

    Nothing of branch a is active any more, yet it never finished: the instance stays
    blocked with the route's reason instead of completing.
    """
    doc = graph(
        [
            node("s", "start"),
            node("split", "parallel_split"),
            action("a"),
            node("g", "exclusive"),
            action("b"),
            node("e", "end"),
        ],
        [
            ("s", "split"),
            ("split", "a"),
            ("split", "b"),
            ("a", "g"),
            ("g", "e", {"var": "missing", "op": "exists"}),
            ("b", "e"),
        ],
    )
    effects.SCRIPT["alpha.write"] = [None, Pending(poll_after=60)]  # a: done; b: polls
    instance = drive(start(doc))
    assert instance.status == InstanceStatus.BLOCKED
    assert token_of(instance, "b").state == TokenState.READY  # polling its provider
    make_due(token_of(instance, "b"))
    instance = drive(instance)
    assert token_of(instance, "b").state == TokenState.COMPLETED
    assert instance.status == InstanceStatus.BLOCKED, "completed although branch a never did"
    assert "gateway 'g'" in instance.reason
