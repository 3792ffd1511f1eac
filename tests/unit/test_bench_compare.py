"""``bench/compare.py``: which setting and values it compares, and one run's line.

The runs need a PostgreSQL server and minutes; these check what it accepts and refuses,
and its report of a run, on made-up figures.
"""

from __future__ import annotations

import pytest

from bench import compare


def test_a_setting_with_its_values_and_the_run_options_are_read():
    args = compare.parse(["GOVFLOW_WORKER_RUNS=8,16,32", "--workers", "1,2", "--rounds", "4"])
    assert (args.name, args.values) == ("GOVFLOW_WORKER_RUNS", ["8", "16", "32"])
    assert (args.worker_counts, args.rounds, args.n) == ([1, 2], 4, 2000)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["GOVFLOW_WORKER_RUNS=8"], "two or more values"),
        (["WORKER_RUNS=8,16"], "two or more values"),
        (["GOVFLOW_WORKER_RUNS=8,,16"], "two or more values"),
        (["GOVFLOW_WORKER_RUNS=8,8"], "names a value twice"),
        (["GOVFLOW_WORKER_RUNS=8,16", "--workers", "one"], "whole numbers"),
        (["GOVFLOW_WORKER_RUNS=8,16", "--rounds", "0"], "must be positive"),
    ],
)
def test_what_cannot_be_compared_is_refused_with_what_to_write(argv, said, capsys):
    with pytest.raises(SystemExit) as refused:
        compare.parse(argv)
    assert refused.value.code == 2
    assert said in capsys.readouterr().err


def test_a_runs_line_has_its_speed_cpu_per_process_commits_and_steal():
    result = {
        "steps_per_s": 412.34,
        "cpu": {"qcluster workers": 2.104, "pusher": 0.11, "sentinel": 0.0},
        "per_step": {"server_cpu_ms": 1.634, "commits": 1.062},
        "steal": 0.013,
    }
    text = compare.line("GOVFLOW_WORKER_RUNS", "16", 2, 0, result)
    assert text == (
        "GOVFLOW_WORKER_RUNS=16, 2 worker(s), round 1: 412.3 steps/s; CPU ms per step: "
        "pusher 0.11, qcluster workers 2.10, server 1.63; commits per step 1.06; steal 1.3%"
    )
