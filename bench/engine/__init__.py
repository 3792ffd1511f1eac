"""GovFlow engine versus DBOS Transact: throughput, commits, recovery, timer lag.

The entry point is ``bench/engine_vs_dbos.py`` (``make bench`` runs it after the ledger
benchmark, on the same server). GovFlow runs through real ``manage.py qcluster`` process
groups with :mod:`bench.engine.settings`; DBOS runs in its own virtual environment
(``bench/.venv-dbos``) as subprocesses of :mod:`bench.engine.dbos_app`.
"""
