"""The engine benchmark's ``--only``: chosen scenarios, and only their sections and targets.

The runs need a PostgreSQL server and minutes; these check the choice and the report of a
partial run, on made-up figures.
"""

from __future__ import annotations

import argparse

import pytest

from bench.engine import report
from bench.engine.scenarios import SCENARIOS, scenario_list


def test_only_runs_the_named_scenarios_in_the_order_a_full_run_has_them():
    assert scenario_list("pause, recovery") == ("recovery", "pause")
    assert scenario_list(",".join(reversed(SCENARIOS))) == SCENARIOS


def test_an_unknown_scenario_is_refused_with_the_names_to_choose_from():
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        scenario_list("pause,recovry")
    assert "unknown scenario(s) recovry" in str(refused.value)
    assert "throughput,growth,recovery,pause,timers" in str(refused.value)
    with pytest.raises(argparse.ArgumentTypeError):
        scenario_list(" , ")


def _pause(took: float | None) -> dict:
    return {
        "workers": 2,
        "instances": 1000,
        "held_at_stop": 8,
        "taken_over": 7 if took is not None else 6,
        "released_by_holder": 1,
        "takeover_seconds": took,
        "pause_limit": 60.0,
        "lease_ttl": 5.0,
        "runs_per_instance": 1.01,
        "statuses": {"completed": 998, "blocked": 2},
    }


def test_a_pause_only_run_prints_its_section_and_its_targets_alone():
    results = {
        "environment": {"lines": ["machine: test"]},
        "govflow_pause": _pause(5.07),
        "elapsed": 70.0,
        "log_dir": "logs",
    }
    lines: list[str] = []
    report.print_report(results, lines.append)
    text = "\n".join(lines)
    assert "Pause (GovFlow)" in text and "all taken over 5.07 s after the SIGSTOP" in text
    assert "1 released by the paused cluster itself" in text
    assert "Throughput" not in text and "Recovery" not in text and "Timers" not in text
    targets = report.evaluate(results)
    assert [t[0] for t in targets] == [
        "takeover after a SIGSTOP pause",
        "tasks/claims per instance, over its runs",
    ]
    assert targets[0][3] is True


def test_a_pause_not_taken_over_in_time_is_not_met():
    [pause, _] = report.evaluate({"govflow_pause": _pause(None)})
    assert pause[1] == "> 60 s" and pause[3] is False
