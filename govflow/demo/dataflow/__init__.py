"""Dataflow: a small demo module whose runs publish a dataset, with its own recovery boundary.

A workflow links to its runs through a ``linked_run`` node (``docs/linked-runs.md``). The
module keeps its own ledger for its publication step (``recovery.api``, as any module
provider would), so it can itself be unsure whether a publication happened
(``unknown_publication``), and only its own reconcile settles that.
"""
