"""The engine benchmark's CPU steal: the hypervisor's share of the machine's time in a run."""

from __future__ import annotations

from bench.engine import counters


def test_steal_is_the_stolen_ticks_over_all_ticks_between_two_readings():
    assert counters.steal_share((10, 1_000), (60, 1_500)) == 0.1
    assert counters.steal_share((10, 1_000), (10, 1_000)) is None  # no time passed


def test_a_machine_without_proc_stat_reads_no_ticks(monkeypatch):
    def missing(*args, **kwargs):
        raise FileNotFoundError("/proc/stat")

    monkeypatch.setattr("builtins.open", missing)
    assert counters.machine_ticks() == (0, 0)
    assert counters.steal_share(counters.machine_ticks(), counters.machine_ticks()) is None


def test_this_machine_reads_steal_within_all_ticks():
    steal, ticks = counters.machine_ticks()
    assert 0 <= steal <= ticks
