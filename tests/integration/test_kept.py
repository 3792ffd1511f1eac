"""Settings and the thread's connection, kept between a step's reads (recovery.kept).

What is kept must never be stale: a changed setting is read again at once, and each
thread gets its own connection, as Django's own handler gives it.
"""

from __future__ import annotations

import threading

from django.db import DEFAULT_DB_ALIAS, connections
from django.test import override_settings

from govflow.engine import conf
from recovery.api import default_db, dialect, kept_setting
from recovery.kept import kept_made


def test_a_changed_setting_is_read_again_and_restored_after():
    before = conf.lease_ttl()
    assert kept_setting("GOVFLOW_LEASE_TTL", conf.LEASE_TTL.default) == before  # kept now
    with override_settings(GOVFLOW_LEASE_TTL=before + 17):
        assert conf.lease_ttl() == before + 17
        assert kept_setting("GOVFLOW_LEASE_TTL", conf.LEASE_TTL.default) == before + 17
    assert conf.lease_ttl() == before


def test_the_settings_fixture_changes_what_the_engine_reads(settings):
    assert conf.max_steps_per_run() == conf.MAX_STEPS_PER_RUN.value()
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 3
    assert conf.max_steps_per_run() == 3


def test_an_unset_setting_answers_its_default_and_then_its_value():
    assert kept_setting("RECOVERY_NOT_A_SETTING", 5) == 5
    with override_settings(RECOVERY_NOT_A_SETTING=6):
        assert kept_setting("RECOVERY_NOT_A_SETTING", 5) == 6
    assert kept_setting("RECOVERY_NOT_A_SETTING", 5) == 5


def test_each_thread_gets_its_own_connection_as_djangos_handler_gives_it():
    mine = default_db()
    assert mine is connections[DEFAULT_DB_ALIAS]
    assert default_db() is mine
    seen = {}

    def other() -> None:
        try:
            seen["kept"], seen["django"] = default_db(), connections[DEFAULT_DB_ALIAS]
            seen["dialect"] = dialect()
        finally:
            connections.close_all()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen["kept"] is seen["django"]
    assert seen["kept"] is not mine
    assert seen["dialect"] is dialect()


def test_what_is_made_from_settings_is_made_again_after_a_change():
    made = []

    def make() -> int:
        made.append(1)
        return len(made)

    assert kept_made("tests.kept.made", make) == 1
    assert kept_made("tests.kept.made", make) == 1  # kept: not made again
    with override_settings(RECOVERY_NOT_A_SETTING=1):
        assert kept_made("tests.kept.made", make) == 2
    assert kept_made("tests.kept.made", make) == 3
    assert dialect() is dialect()
