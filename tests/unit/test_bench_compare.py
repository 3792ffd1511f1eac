"""``bench/compare.py``: which setting and values it compares, and one run's line.

The runs need a PostgreSQL server and minutes; these check what it accepts and refuses,
and its report of a run, on made-up figures.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def test_importing_the_bench_modules_leaves_the_environment_as_it_was():
    """The test suite imports them, and every process it starts inherits its environment:
    a module that set GOVFLOW_LOG_LEVEL when imported once silenced ``make run``'s worker
    cluster in tests/process/test_make_run.py."""
    probe = (
        "import os, sys; before = dict(os.environ); sys.path.insert(0, '.'); "
        "import bench.compare, bench.engine_vs_dbos, bench.engine.scenarios, "
        "bench.engine.sampling, bench.engine.growth; "
        "print(sorted(k for k in set(before) | set(os.environ) "
        "if before.get(k) != os.environ.get(k)))"
    )
    root = Path(__file__).resolve().parents[2]
    # Without GovFlow's settings: this process may have them already (set by a module it
    # imported, say), and a module that sets one to the same value would go unseen.
    env = {key: value for key, value in os.environ.items() if not key.startswith("GOVFLOW_")}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
