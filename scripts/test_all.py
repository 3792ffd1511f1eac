"""Run the whole suite on SQLite and on PostgreSQL, and say what ran where.

PostgreSQL: ``DATABASE_URL`` if it points at a server; otherwise a throwaway server is
started with ``scripts/pg-server`` and removed afterwards. Exits non-zero when either
backend fails, ran no test, or could not run at all. Extra arguments go to pytest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"


def run_pytest(backend: str, env: dict[str, str], args: list[str]) -> dict[str, int]:
    VAR.mkdir(exist_ok=True)
    report = VAR / f"junit-{backend}.xml"
    report.unlink(missing_ok=True)
    print(f"\n===== {backend}: running the suite =====", flush=True)
    # Every process of the run (pytest, the clusters and servers the tests start, each of
    # which makes throwaway folders for evidence and anchors at start-up) makes its
    # temporary files in one folder, removed afterwards: a killed process cleans nothing.
    with tempfile.TemporaryDirectory(prefix="govflow-test-", ignore_cleanup_errors=True) as tmp:
        os.chmod(tmp, 0o711)  # a server the tests start may run as 'postgres'
        code = subprocess.call(
            [
                sys.executable,
                "-m",
                "pytest",
                f"--junitxml={report}",
                "-o",
                f"junit_suite_name={backend}",
                *args,
            ],
            cwd=ROOT,
            env={**env, "TMPDIR": tmp},
        )
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "exit": code}
    if report.exists():
        suite = ET.parse(report).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        total = int(suite.get("tests", 0))
        counts["failed"] = int(suite.get("failures", 0))
        counts["errors"] = int(suite.get("errors", 0))
        counts["skipped"] = int(suite.get("skipped", 0))
        counts["passed"] = total - counts["failed"] - counts["errors"] - counts["skipped"]
    return counts


def main(args: list[str]) -> int:
    base_env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    results: dict[str, dict[str, int] | None] = {}
    results["sqlite"] = run_pytest("sqlite", base_env, args)

    url = os.environ.get("DATABASE_URL", "")
    server_dir = None
    if not url.startswith(("postgres://", "postgresql://")):
        parent = tempfile.mkdtemp(prefix="govflow-pg-")
        os.chmod(parent, 0o711)  # the server runs as 'postgres' when we are root
        server_dir = os.path.join(parent, "server")
        started = subprocess.run(
            [str(ROOT / "scripts" / "pg-server"), "start", server_dir],
            capture_output=True,
            text=True,
        )
        if started.returncode != 0:
            print(started.stderr, file=sys.stderr)
            print(
                "PostgreSQL could not be started; the PostgreSQL run is missing.", file=sys.stderr
            )
            results["postgresql"] = None
        else:
            url = started.stdout.strip().removeprefix("DATABASE_URL=")
    try:
        if "postgresql" not in results:
            results["postgresql"] = run_pytest(
                "postgresql", {**base_env, "DATABASE_URL": url}, args
            )
    finally:
        if server_dir:
            subprocess.call(
                [str(ROOT / "scripts" / "pg-server"), "stop", server_dir], stderr=subprocess.DEVNULL
            )
            shutil.rmtree(os.path.dirname(server_dir), ignore_errors=True)

    print("\n===== summary =====")
    ok = True
    totals = {"passed": 0, "failed": 0}
    for backend, counts in results.items():
        if counts is None:
            print(f"{backend}: DID NOT RUN")
            ok = False
            continue
        failed = counts["failed"] + counts["errors"]
        totals["passed"] += counts["passed"]
        totals["failed"] += failed
        print(
            f"{backend}: {counts['passed']} passed, {failed} failed, "
            f"{counts['skipped']} skipped (pytest exit {counts['exit']})"
        )
        if counts["exit"] != 0 or counts["passed"] == 0:
            ok = False
    print(f"{totals['passed']} passed, {totals['failed']} failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
