"""A test provider app whose actions tests can steer (in-process and across processes)."""
