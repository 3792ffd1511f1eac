"""What every single-process benchmark does around its measurement.

A Django test database on the benchmark's PostgreSQL server (:func:`django_test_db`), and
the run around it (:func:`run_bench`): a setup problem is exit 2 with its reason, a failure
of the benchmark itself exit 1 with its traceback and a warning that no figure is valid,
and the targets are saved for ``bench/run.py``'s summary. Used by ``bench/ledger.py`` and
``bench/tasks.py``.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from time import perf_counter

from pgserver import BenchSetupError, Server
from report import Target, save_targets, say

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = "govflow.settings.test"


@contextmanager
def django_test_db(server: Server, prefix: str, settings: str = SETTINGS) -> Iterator[str]:
    """Set Django up on ``server`` with a fresh test database; yield its name, then drop it."""
    os.environ["DATABASE_URL"] = server.url
    os.environ["DJANGO_SETTINGS_MODULE"] = settings
    sys.path.insert(1, str(ROOT))  # as pytest's rootdir: the test settings load tests/
    import django

    django.setup()
    from django.db import connection

    original = connection.settings_dict["NAME"]
    connection.settings_dict["TEST"]["NAME"] = f"{prefix}_{os.getpid()}"
    db_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        yield db_name
    finally:
        # The test settings' evidence and anchors folders go when this process exits.
        connection.creation.destroy_test_db(original, verbosity=0)


def run_bench(targets_json: str | None, body: Callable[[], list[Target]]) -> int:
    """Run ``body``, save its targets, say how long it took; the process's exit status."""
    started = perf_counter()
    try:
        targets = body()
    except BenchSetupError as exc:
        say(f"\nThe benchmark could not set itself up: {exc}")
        return 2
    except Exception:
        traceback.print_exc()
        say("\nThe benchmark itself failed (traceback above): no figure above is valid.")
        return 1
    if targets_json:
        save_targets(targets_json, targets)
    say(f"(the benchmark took {perf_counter() - started:.0f} s)")
    return 0
