"""Development settings: ``make run``."""

from .base import *  # noqa: F403

DEBUG = True
# The demo provider module: development and tests only, never production.
INSTALLED_APPS = [*INSTALLED_APPS, "govflow.demo", "govflow.demo.dataflow"]  # noqa: F405
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]", *ALLOWED_HOSTS]  # noqa: F405

# Webhooks to a receiver on this machine (development and tests only, never production).
GOVFLOW_WEBHOOK_ALLOW_HTTP = True
GOVFLOW_WEBHOOK_ALLOW_PRIVATE = True
