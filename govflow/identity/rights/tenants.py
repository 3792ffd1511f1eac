"""The prefix of tenant groups, as the engine's tenancy names them.

Identity imports nothing of the engine (docs/architecture.md), so the prefix is repeated
here; a test keeps it equal to ``govflow.engine.tenancy.TENANT_GROUP_PREFIX``.
"""

TENANT_GROUP_PREFIX = "tenant:"
