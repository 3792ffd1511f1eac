"""The identity app's admin: user and group pages with four eyes on grants, and the list
of rights changes a second administrator confirms (ADR 0025)."""

from .rights import admin_changes  # noqa: F401  (registers RightsChange)
from .rights.admin import install

install()
