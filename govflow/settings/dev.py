"""Development settings: ``make run``."""

import os

from .base import *  # noqa: F403

DEBUG = True
# The demo provider module: development and tests only, never production.
INSTALLED_APPS = [*INSTALLED_APPS, "govflow.demo"]  # noqa: F405
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]", *ALLOWED_HOSTS]  # noqa: F405
# The demo runs for its municipality (the API key of `make run` is this tenant's too).
if not os.environ.get("GOVFLOW_TENANTS"):
    GOVFLOW_TENANTS = ["demo-municipality", "default"]
