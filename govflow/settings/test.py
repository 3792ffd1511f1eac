"""Test settings: fast password hashing, evidence and anchors in throwaway folders, fixed keys."""

import atexit
import os
import shutil
import tempfile

from .base import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]


def _throwaway_folder(prefix: str) -> str:
    """A folder of this process's own, removed when it exits (a killed process leaves it:
    ``scripts/test_all.py`` gives each pytest run a temporary folder of its own)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path


EVIDENCE_ROOT = _throwaway_folder("govflow-evidence-")
STORAGES["recovery_evidence"]["OPTIONS"]["location"] = EVIDENCE_ROOT  # noqa: F405
# Anchors in a throwaway folder per process (tests/conftest.py gives each test its own).
RECOVERY_ANCHOR_PATH = os.environ.get("GOVFLOW_ANCHOR_PATH") or os.path.join(
    _throwaway_folder("govflow-anchors-"), "ledger.anchors"
)
RECOVERY_CHAIN_KEYS = os.environ.get(
    "GOVFLOW_CHAIN_KEYS",
    "test2:" + "22" * 32 + ",test1:" + "11" * 32,
)

# Test provider apps (tests/providers): steerable actions of every recovery mode.
INSTALLED_APPS = [
    *INSTALLED_APPS,  # noqa: F405
    "govflow.demo",
    "govflow.demo.dataflow",
    "tests.providers.alpha",
    "tests.providers.beta",
]
ALPHA_STORE = os.environ.get("ALPHA_STORE", "")

# Webhooks to a receiver on this machine (development and tests only, never production).
GOVFLOW_WEBHOOK_ALLOW_HTTP = True
GOVFLOW_WEBHOOK_ALLOW_PRIVATE = True
