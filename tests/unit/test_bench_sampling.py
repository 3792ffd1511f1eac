"""The engine benchmark's sampled profile: py-spy on a running process, read by group."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from bench.engine import sampling

SERVE = "_serve (govflow/engine/runpool.py:138)"
SETTLE = "settle (govflow/engine/services/settle.py:90)"
RAW = "\n".join(
    [
        f"{SERVE};{SETTLE};execute (psycopg/cursor.py:97) 6",
        f"{SERVE};{SETTLE};prepare (recovery/chain/links.py:40);"
        "fingerprint (recovery/canonical.py:381) 3",
        f"{SERVE};_serve (govflow/engine/runpool.py:139);get (queue.py:180) 1",
    ]
)


def test_samples_are_shared_by_the_running_function_s_package_and_by_callers(tmp_path):
    raw = tmp_path / "worker.pyspy"
    raw.write_text(RAW)

    summary = sampling.summary(raw)

    assert summary["samples"] == 10
    groups = dict((name, share) for share, name in summary["groups"])
    assert groups[sampling.group_of("psycopg/cursor.py")] == pytest.approx(0.6)
    assert groups[sampling.group_of("recovery/canonical.py")] == pytest.approx(0.3)
    assert groups[sampling.group_of("queue.py")] == pytest.approx(0.1)
    inclusive = dict((name, share) for share, name in summary["inclusive"])
    # A function is counted once per stack, however often it recurs in it.
    assert inclusive["_serve (govflow/engine/runpool.py)"] == pytest.approx(1.0)
    assert inclusive["settle (govflow/engine/services/settle.py)"] == pytest.approx(0.9)
    assert inclusive["prepare (recovery/chain/links.py)"] == pytest.approx(0.3)
    assert summary["running"][0] == (pytest.approx(0.6), "execute (psycopg/cursor.py)")


def test_an_empty_recording_has_no_shares(tmp_path):
    raw = tmp_path / "worker.pyspy"
    raw.write_text("")
    assert sampling.summary(raw) == {"samples": 0}


BURN = textwrap.dedent(
    """\
    import sys

    def burn():
        total = 0
        for n in range(10_000):
            total += n * n
        return total

    print("ready", flush=True)
    while sys.stdin.readable():
        burn()
    """
)


@pytest.mark.skipif(sampling.py_spy() is None, reason="py-spy is not installed")
def test_a_running_process_is_sampled_where_it_spends_its_time(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        sampler = sampling.Sampler(child.pid, tmp_path / "burn.pyspy")
        deadline = time.monotonic() + 60
        # Half a second of the child's CPU time, however long a busy machine takes.
        while (
            sum(sampling.thread_ticks(child.pid).values()) - sum(sampler.ticks_before.values())
            < sampling.CLOCK_TICKS // 2
        ):
            assert time.monotonic() < deadline, "the child used no CPU"
            time.sleep(0.05)
        used = sampler.stop()
    finally:
        child.kill()
        child.wait()

    assert not sampler.why_not, sampler.why_not
    assert sampling.seconds(sum(used.values())) >= 0.5
    summary = sampling.summary(sampler.out)
    assert summary["samples"] > 0
    share, running = summary["running"][0]
    assert running.startswith("burn (") and share > 0.5, summary["running"]


def test_a_process_that_is_gone_is_not_sampled(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    sampler = sampling.Sampler(child.pid, tmp_path / "gone.pyspy")
    assert sampler.stop() == {}
    assert sampler.why_not  # py-spy found nothing to record, or is not installed
