"""The demo provider module used by ``make run``, the docs and the tests."""
