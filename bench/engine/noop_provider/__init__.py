"""A benchmark-only provider: one non-atomic action that does nothing."""
