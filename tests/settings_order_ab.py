"""Test settings with the provider apps installed as alpha, then beta (see test_engine_modules)."""

from govflow.settings.test import *  # noqa: F403

PROVIDERS = ["tests.providers.alpha", "tests.providers.beta"]
INSTALLED_APPS = [app for app in INSTALLED_APPS if app not in PROVIDERS] + PROVIDERS  # noqa: F405
