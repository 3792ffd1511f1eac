"""The engine benchmark's cost-growth runs and targets (``make bench``), on made-up figures.

The runs themselves need a PostgreSQL server and minutes (``make bench ARGS=--quick``);
these check what they plan and how their figures become the printed targets.
"""

from __future__ import annotations

from bench.engine import growth, report


def _run(*, length: int, in_flight: int, steps_per_s: float, cpu_ms: float, claims=1.0) -> dict:
    return {
        "length": length,
        "in_flight": in_flight,
        "waves": 1,
        "instances": in_flight,
        "steps": in_flight * length,
        "seconds": in_flight * length / steps_per_s,
        "steps_per_s": steps_per_s,
        "statuses": {"completed": in_flight},
        "runs_per_instance": claims,
        "tasks_per_instance": 0.0,
        "runs_needed": 1,
        "per_step": {"commits": 1.0, "statements": 9.0},
        "cpu": {"qcluster workers": cpu_ms * 0.9, "main process (sweeper thread)": cpu_ms * 0.1},
    }


def _growth(*, big_rate=300.0, long_rate=310.0, long_cpu=3.0, claims=1.0) -> dict:
    return {
        "workers": 2,
        "in_flight": [
            _run(length=5, in_flight=100, steps_per_s=300.0, cpu_ms=3.0),
            _run(length=5, in_flight=10000, steps_per_s=big_rate, cpu_ms=3.0, claims=claims),
        ],
        "lengths": [
            _run(length=5, in_flight=800, steps_per_s=300.0, cpu_ms=3.0),
            _run(length=200, in_flight=20, steps_per_s=long_rate, cpu_ms=long_cpu),
        ],
    }


def test_the_full_run_grows_to_ten_thousand_in_flight_and_two_hundred_steps():
    plan = growth.plan(quick=False, in_flight=None, lengths=None, steps=None)
    assert plan.in_flight == (100, 1000, 10000)
    assert plan.lengths == (5, 200)
    assert [plan.waves(n) for n in plan.in_flight] == [8, 1, 1]  # 4,000 steps at least
    assert [plan.instances(length) for length in plan.lengths] == [800, 20]


def test_the_quick_run_is_scaled_down_and_the_options_override_it():
    quick = growth.plan(quick=True, in_flight=None, lengths=None, steps=None)
    assert (quick.in_flight, quick.lengths, quick.steps) == ((100, 1000), (5, 50), 1000)
    chosen = growth.plan(quick=True, in_flight="500, 50", lengths="300,5", steps=600)
    assert (chosen.in_flight, chosen.lengths) == ((50, 500), (5, 300))
    assert chosen.instances(300) == chosen.workers  # every worker has an instance to run


def test_flat_cost_meets_both_growth_targets():
    targets = growth.evaluate(_growth())
    assert [(figure, ok) for figure, _, _, ok in targets] == [
        ("steps/s, 10,000 vs 100 in flight", True),
        ("client CPU per step, 10,000 vs 100 in flight", True),
        ("steps/s, 200-step vs 5-step instances", True),
        ("client CPU per step, 200-step vs 5-step instances", True),
    ]
    assert targets[2][1:3] == ("1.03x (310.0 vs 300.0)", ">= 0.9x")


def test_a_step_that_costs_more_in_a_long_instance_misses_the_length_targets():
    targets = {f: (v, ok) for f, v, _, ok in growth.evaluate(_growth(long_rate=90, long_cpu=9))}
    assert targets["steps/s, 200-step vs 5-step instances"] == ("0.30x (90.0 vs 300.0)", False)
    assert targets["client CPU per step, 200-step vs 5-step instances"] == (
        "3.00x (9.00 vs 3.00 ms)",
        False,
    )


def test_a_backlog_that_slows_every_step_misses_the_in_flight_target():
    targets = {f: ok for f, _, _, ok in growth.evaluate(_growth(big_rate=200.0))}
    assert targets["steps/s, 10,000 vs 100 in flight"] is False


def _results(growth_figures: dict | None) -> dict:
    per_step = {"write_commits": 1.0, "commits": 1.1}
    throughput = [
        {"workers": w, "steps_per_s": 100.0 * w, "runs_per_instance": 1.0, "per_step": per_step}
        for w in (1, 2, 4)
    ]
    dbos = [{"workers": w, "steps_per_s": 60.0 * w} for w in (1, 2, 4)]
    return {
        "govflow_tput": throughput,
        "dbos_tput": dbos,
        "govflow_recovery": {"seconds": 5.0},
        "dbos_recovery": {"seconds": 10.0},
        "govflow_timers": {"lag": {"p99": 0.5}},
        "govflow_growth": growth_figures,
    }


def test_the_targets_table_has_four_workers_against_dbos_and_the_growth_rows():
    figures = [figure for figure, *_ in report.evaluate(_results(_growth()))]
    assert "steps/s vs DBOS, 4 worker process(es)" in figures
    assert "steps/s, 10,000 vs 100 in flight" in figures
    assert "client CPU per step, 200-step vs 5-step instances" in figures


def test_claims_per_instance_names_the_worst_run_growth_runs_included():
    targets = {f: (v, ok) for f, v, _, ok in report.evaluate(_results(_growth(claims=1.5)))}
    value, ok = targets["tasks/claims per instance, over its runs"]
    assert value == "1.50 (worst: growth 10,000 x 5 steps)"
    assert ok is False
