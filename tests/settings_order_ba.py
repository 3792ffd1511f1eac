"""Test settings with the provider apps installed as beta, then alpha (see test_engine_modules)."""

from govflow.settings.test import *  # noqa: F403

PROVIDERS = ["tests.providers.beta", "tests.providers.alpha"]
INSTALLED_APPS = PROVIDERS + [app for app in INSTALLED_APPS if app not in PROVIDERS]  # noqa: F405
