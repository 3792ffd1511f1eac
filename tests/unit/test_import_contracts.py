"""The import direction holds, and each contract fails when a violation is planted.

``make lint`` runs ``lint-imports`` on the tree as it is. Here each contract of
``pyproject.toml`` is run on a copy of the packages with one forbidden import planted, so a
contract that silently checks nothing (a typo in a module name, a wildcard that matches no
module) fails this test instead of passing ``make lint``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

CONTRACTS = {
    "recovery-standalone": "recovery imports nothing from govflow",
    "recovery-one-door": "govflow reaches recovery through recovery.api only",
    "engine-core-below": "the engine does not import the apps built on it",
    "demo-unimported": "nothing imports the demo",
    "demo-public-surface": "the demo uses only the engine's provider, services and selectors",
}

# contract id -> (module written into the copy, its text)
PLANTED = {
    "recovery-standalone": ("recovery/planted.py", "from govflow.engine import models\n"),
    "recovery-one-door": ("govflow/engine/planted.py", "from recovery.models import Operation\n"),
    "engine-core-below": ("govflow/engine/planted.py", "from govflow.handoffs import apps\n"),
    "demo-unimported": ("govflow/handoffs/planted.py", "from govflow.demo import sample\n"),
    "demo-public-surface": (
        "govflow/demo/planted.py",
        "from govflow.engine.models import Instance\n",
    ),
}


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "templates", "workflows")
    for package in ("govflow", "recovery"):
        shutil.copytree(ROOT / package, tree / package, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


def _lint(tree: Path) -> tuple[int, str]:
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: pip install -e '.[dev]' installs import-linter")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout + done.stderr


def _verdicts(output: str) -> dict[str, str]:
    found = {}
    for contract_id, name in CONTRACTS.items():
        lines = [line for line in output.splitlines() if line.startswith(f"{name} ")]
        assert lines, f"contract {contract_id!r} was not checked:\n{output}"
        found[contract_id] = "BROKEN" if "BROKEN" in lines[0] else "KEPT"
    return found


def test_every_contract_is_kept_by_the_tree_as_it_is(tmp_path):
    code, output = _lint(_copy(tmp_path))

    assert code == 0, output
    assert set(_verdicts(output).values()) == {"KEPT"}


@pytest.mark.parametrize("contract_id", sorted(PLANTED))
def test_a_planted_violation_breaks_its_contract_and_only_it(tmp_path, contract_id):
    tree = _copy(tmp_path)
    path, text = PLANTED[contract_id]
    (tree / path).write_text(text)

    code, output = _lint(tree)

    assert code != 0, output
    verdicts = _verdicts(output)
    assert verdicts.pop(contract_id) == "BROKEN", output
    assert set(verdicts.values()) == {"KEPT"}, output
    assert path.removesuffix(".py").replace("/", ".") in output, "the report names the importer"


def test_the_architecture_page_shows_the_import_graph_as_it_is():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "import_graph.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert f"```\n{done.stdout}```" in page, (
        "docs/architecture.md's import graph is out of date: paste the output of "
        "`python scripts/import_graph.py` into its block"
    )
