"""Developer tooling beside the product (not installed with it): the make targets' helpers.

A package so that ``scripts.procgroup`` imports the same way from ``bench/`` and ``tests/``.
"""
