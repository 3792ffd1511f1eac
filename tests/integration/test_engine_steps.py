"""Non-atomic steps: success, retries, permanent failure, pending providers, uncertainty."""

from __future__ import annotations

import datetime as dt

import pytest

from govflow.engine.errors import EngineConflict
from govflow.engine.models import Incident, InstanceStatus, Token, TokenState, WaitKind
from govflow.engine.provider import Failed, Pending, Succeeded, Unknown
from govflow.engine.registry import registry
from govflow.engine.services.instances import step_retry
from govflow.engine.services.runtime import instance_run
from recovery.models import Checkpoint, Operation
from tests.dbclock import db_now
from tests.engine_helpers import (
    alpha_write,
    as_if_the_engine_wrote_it,
    chain_ok,
    counted,
    make_due,
    op_states,
    operations,
    subject,
    token_of,
)
from tests.flows import action, drive, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db


def run(instance):
    report = instance_run(instance_id=instance.pk)
    instance.refresh_from_db()
    return report


def test_non_atomic_step_records_two_checkpoints_and_maps_its_output():
    instance = drive(start(linear(action("a"), action("b", output={"receipt.key": "key"}))))
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert instance.completed_at is not None
    # Without an output mapping the whole result sits under the node id.
    assert instance.variables["a"] == {
        "stored": "v1",
        "key": token_of(instance, "a").idempotency_key,
    }
    assert instance.variables["receipt"] == {"key": token_of(instance, "b").idempotency_key}
    assert "b" not in instance.variables
    assert op_states(instance) == ["succeeded", "succeeded"]
    kinds = list(
        Checkpoint.objects.filter(subject_id=subject(instance).id)
        .order_by("seq")
        .values_list("kind", flat=True)
    )
    # The start commit records the instance's first projection; from then on each step's
    # ledger writes carry the projection's fingerprint, so no step needs a checkpoint more.
    assert kinds == ["projection"] + ["operation.recorded", "operation.observed"] * 2
    assert chain_ok(instance)
    assert effects.call_count("alpha.write") == 2 and len(effects.effects()) == 2


def test_start_node_leaves_a_variable_named_like_it_alone():
    instance = drive(start(linear(action("a")), variables={"value": "v1", "start": "2027-01-01"}))
    assert instance.status == InstanceStatus.COMPLETED
    assert instance.variables["start"] == "2027-01-01"


def test_the_ledger_holds_fingerprints_never_the_raw_input():
    drive(start(linear(action("a")), variables={"value": "secret-national-id-123"}))
    [op] = Operation.objects.all()
    assert len(op.input_fp) == 64
    stored = " ".join(str(v) for v in op.__dict__.values())
    stored += " ".join(Checkpoint.objects.values_list("fact", flat=True))
    assert "secret-national-id-123" not in stored


def test_transient_failure_is_retried_after_backoff_under_a_new_key_and_same_idempotency():
    effects.SCRIPT["alpha.write"] = [Failed("registry busy")]
    write, calls = counted(retry_backoff=60)
    with registry.override(write):
        instance = start(linear(action("a")))
        run(instance)
        token = token_of(instance, "a")
        assert (token.state, token.attempt, token.wait_kind) == (
            TokenState.READY,
            1,
            WaitKind.RETRY,
        )
        assert token.not_before > db_now() + dt.timedelta(seconds=50)
        assert token.reason == "transient failure (registry busy); retry in 60 s"
        assert instance.status == InstanceStatus.RUNNING
        assert op_states(instance) == ["failed"]
        assert run(instance).steps == 0, "nothing runs before the backoff has passed"
        assert calls == [("execute", 0, 0)]
        make_due(token)
        run(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    first, second = operations(instance)
    assert (first.state, second.state) == ("failed", "succeeded")
    assert first.key != second.key
    assert first.idempotency_fp == second.idempotency_fp
    assert (first.ordinal, second.ordinal) == (0, 1)
    assert calls == [("execute", 0, 0), ("execute", 1, 0)] and len(effects.effects()) == 1
    assert chain_ok(instance)


def test_permanent_failure_fails_the_instance_with_an_incident():
    effects.SCRIPT["alpha.write"] = [Failed("applicant unknown", permanent=True)]
    write, calls = counted()
    with registry.override(write):
        instance = drive(start(linear(action("a"), action("b"))))
    assert instance.status == InstanceStatus.FAILED
    assert instance.reason == "Step 'a' failed (permanent failure): applicant unknown"
    assert token_of(instance, "a").state == TokenState.FAILED
    assert op_states(instance) == ["failed"]
    incident = Incident.objects.get(instance=instance)
    assert (incident.kind, incident.message) == ("step_failed", instance.reason)
    assert len(calls) == 1, "a permanent failure is not retried"
    assert chain_ok(instance)


def test_exhausted_retry_budget_fails_the_instance():
    effects.SCRIPT["alpha.write"] = [Failed("busy")] * 3
    write, calls = counted(retry_budget=2)
    with registry.override(write):
        instance = start(linear(action("a")))
        for _ in range(3):
            run(instance)
            make_due(token_of(instance, "a"))
        assert run(instance).steps == 0
    assert instance.status == InstanceStatus.FAILED
    assert instance.reason == "Step 'a' failed (retry budget of 2 exhausted): busy"
    ops = operations(instance)
    assert [op.state for op in ops] == ["failed"] * 3
    assert len({op.key for op in ops}) == 3 and len({op.idempotency_fp for op in ops}) == 1
    assert [attempt for _, attempt, _ in calls] == [0, 1, 2]


def test_pending_provider_is_polled_later_under_new_keys_with_the_same_idempotency():
    effects.SCRIPT["alpha.write"] = [Pending(poll_after=60)]
    effects.SCRIPT["alpha.write:poll"] = [
        Pending(poll_after=60),
        Succeeded({"stored": "v1", "paid": True}),
    ]
    write, calls = counted()
    with registry.override(write):
        instance = start(linear(action("a")))
        polled(instance, calls)
    assert calls == [("execute", 0, 0), ("poll", 0, 1), ("poll", 0, 2)]
    ops = operations(instance)
    assert [op.state for op in ops] == ["pending", "pending", "succeeded"]
    assert len({op.key for op in ops}) == 3 and len({op.idempotency_fp for op in ops}) == 1
    assert [op.ordinal for op in ops] == [0, 1, 2]
    assert chain_ok(instance)


def polled(instance, calls) -> None:
    run(instance)
    token = token_of(instance, "a")
    assert (token.state, token.wait_kind, token.poll, token.attempt) == (
        TokenState.READY,
        WaitKind.POLL,
        1,
        0,
    )
    assert token.not_before > db_now() + dt.timedelta(seconds=50)
    assert instance.status == InstanceStatus.WAITING
    assert op_states(instance) == ["pending"]
    assert run(instance).steps == 0
    assert len(calls) == 1, "not polled before poll_after has passed"
    make_due(token)
    run(instance)
    assert token_of(instance, "a").poll == 2 and op_states(instance) == ["pending", "pending"]
    make_due(token)
    run(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert instance.variables["a"] == {"stored": "v1", "paid": True}


def assert_outcome_unknown(instance, *fragments: str) -> None:
    assert instance.status == InstanceStatus.BLOCKED
    token = token_of(instance, "a")
    assert token.state == TokenState.OUTCOME_UNKNOWN
    assert instance.reason.startswith("Outcome unknown: ")
    assert "an operator must record effect confirmed or effect absent" in instance.reason
    for fragment in fragments:
        assert fragment in instance.reason
    assert op_states(instance) == ["outcome_unknown"]
    assert chain_ok(instance)


def test_provider_raising_after_dispatch_makes_the_outcome_unknown_and_stops_there(
    django_user_model,
):
    effects.SCRIPT["alpha.write"] = ["raise_after"]
    instance = drive(start(linear(action("a"), action("b"))))
    assert_outcome_unknown(instance, "the provider raised TimeoutError after dispatch")
    assert len(effects.effects()) == 1 and effects.call_count() == 1
    for _ in range(3):  # redeliveries and sweeps never call the provider again
        assert run(instance).steps == 0
    assert effects.call_count() == 1
    assert "b" not in dict(instance.tokens.values_list("node_id", "state"))
    with pytest.raises(EngineConflict, match="Retry is unavailable while the outcome is unknown"):
        step_retry(instance_id=instance.pk, token_id=token_of(instance, "a").pk, actor=None)
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN


def test_provider_raising_before_its_effect_is_still_an_unknown_outcome():
    # The engine cannot tell "before" from "after": an exception is never proof of absence.
    effects.SCRIPT["alpha.write"] = ["raise_before"]
    instance = drive(start(linear(action("a"))))
    assert_outcome_unknown(instance, "ConnectionError")
    assert effects.effects() == []


def test_unknown_result_makes_the_outcome_unknown():
    effects.SCRIPT["alpha.write"] = [Unknown("the registry did not answer")]
    assert_outcome_unknown(drive(start(linear(action("a")))), "the registry did not answer")


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("returned", "fragment"),
    [
        (None, "the provider returned NoneType, not a result"),
        ({"stored": "v1"}, "the provider returned dict, not a result"),
        (
            Succeeded({"when": dt.date(2027, 1, 1)}),
            "reported success with an output that is not JSON",
        ),
        (Succeeded(None), "reported success with an output that is not JSON"),
        (Succeeded({"name": "Nowak\x00"}), "can keep ($.name:"),
        (Succeeded({"deep": _nested(200)}), "can keep ($.deep"),
    ],
)
def test_invalid_provider_result_makes_the_outcome_unknown(returned, fragment):
    with registry.override(alpha_write(execute=lambda context: returned)):
        instance = drive(start(linear(action("a"))))
    assert_outcome_unknown(instance, fragment)


@pytest.mark.parametrize("poll_after", ["soon", float("nan"), None])
def test_pending_with_an_unusable_poll_delay_makes_the_outcome_unknown(poll_after):
    effects.SCRIPT["alpha.write"] = [Pending(poll_after=poll_after)]
    assert_outcome_unknown(
        drive(start(linear(action("a")))),
        f"the provider answered pending with poll_after={poll_after!r}",
    )


def test_backoff_doubles_but_never_beyond_a_day():
    effects.SCRIPT["alpha.write"] = [Failed("busy")]
    with registry.override(alpha_write(retry_budget=100, retry_backoff=3600)):
        instance = start(linear(action("a")))
        assert run(instance).steps == 2  # start, a
        token = token_of(instance, "a")
        assert token.reason == "transient failure (busy); retry in 3600 s"
        # Many attempts later the delay stays a day: 3600 s x 2^60 would overflow a date.
        Token.objects.filter(pk=token.pk).update(attempt=60, not_before=None)
        as_if_the_engine_wrote_it(instance)
        effects.SCRIPT["alpha.write"] = [Failed("still busy")]
        run(instance)
    token = token_of(instance, "a")
    assert token.reason == "transient failure (still busy); retry in 86400 s"
    assert token.not_before <= db_now() + dt.timedelta(days=1)


def test_a_failed_step_retried_by_an_operator_gets_a_new_key_and_the_same_idempotency():
    effects.SCRIPT["alpha.write"] = [Failed("bad certificate", permanent=True)]
    instance = drive(start(linear(action("a"))))
    assert instance.status == InstanceStatus.FAILED
    retried = step_retry(instance_id=instance.pk, token_id=token_of(instance, "a").pk, actor=None)
    assert retried.status == InstanceStatus.RUNNING and retried.reason == ""
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    first, second = operations(instance)
    assert first.key != second.key and first.idempotency_fp == second.idempotency_fp
    assert token_of(instance, "a").attempt == 1


def test_only_a_failed_step_can_be_retried():
    instance = drive(start(linear(action("a"))))
    with pytest.raises(
        EngineConflict, match="Only a failed step can be retried; this one is completed"
    ):
        step_retry(instance_id=instance.pk, token_id=token_of(instance, "a").pk, actor=None)
