"""Core recovery: fingerprints, ledger operations, fenced leases, hash-chained checkpoints.

The public API lives in :mod:`recovery.api`. This app imports nothing from ``govflow``
and nothing from django-q2, so any Django project can use it.
"""
