"""Development settings: ``make run``."""

from .base import *  # noqa: F403

DEBUG = True
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]", *ALLOWED_HOSTS]  # noqa: F405
