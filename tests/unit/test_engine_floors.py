"""The engine core's floors: each module imports only the ones below it.

Read from the source (module-level, function-level and type-checking imports alike), so a
circle cannot hide behind an import inside a function. ``docs/architecture.md`` ("Inside
the engine core") shows the list this prints:

    .venv/bin/python -m tests.unit.test_engine_floors
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FLOORS = [
    ("govflow.engine.states", "states, the table of step moves"),
    ("govflow.engine.db", "the engine commit, the clock, the SQL dialect"),
    ("govflow.engine.liveness", "who holds a lease, and whether it is alive"),
    ("govflow.engine.queue", "marking instances runnable, claiming them"),
    ("govflow.engine.token_reads", "one instance's steps by state, read by key alone"),
    ("govflow.engine.projection", "the projection's fingerprint"),
    ("govflow.engine.services.rows", "a step's rows in one statement on PostgreSQL"),
    ("govflow.engine.services.routing", "moving tokens along transitions (plans writes)"),
    ("govflow.engine.services.triggers", "messages: delivered, buffered, taken"),
    ("govflow.engine.services.timers", "firing due timers"),
    ("govflow.engine.services.saga_requeue", "ended instances whose compensations must run"),
    ("govflow.engine.services.sweep", "the sweeper"),
    ("govflow.engine.services.writes", "a run's routed rows and instance row"),
    ("govflow.engine.services.handover", "a run's lease taken in its first commit"),
    ("govflow.engine.services.run", "the Run, its commit, seal and lease release"),
    ("govflow.engine.services.load", "a run loaded, and loaded again after a refused commit"),
    ("govflow.engine.services.opening", "a run's lease taken and instance loaded, left open"),
    ("govflow.engine.services.linked_watch", "a linked run's start recorded, its watch begun"),
    ("govflow.engine.services.blocking", "stopping an instance for a person"),
    ("govflow.engine.services.dispatch", "planning a step, recording its dispatch"),
    ("govflow.engine.services.answers", "a provider's answer as evidence; the ladder's wait"),
    ("govflow.engine.services.settle", "recording an answer"),
    ("govflow.engine.services.rehydration", "what a previous holder left executing"),
    ("govflow.engine.services.reconcile", "the reconciliation ladder: the provider asked"),
    ("govflow.engine.services.linked", "a linked run's watch: one look at its descriptor"),
    ("govflow.engine.services.steps", "one step, returning the next move"),
    ("govflow.engine.services.saga_polls", "a pending compensation's next poll"),
    ("govflow.engine.services.saga", "compensations: planned once, run in reverse"),
    ("govflow.engine.services.runtime", "the loop and the protocol"),
]
CORE = [name for name, _ in FLOORS]


def path_of(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def imported(module: str) -> set[str]:
    """Every module ``module`` imports, wherever the import statement is."""
    package = module.rsplit(".", 1)[0].split(".")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path_of(module).read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def core_imports(module: str) -> list[str]:
    return sorted(name for name in imported(module) if name in CORE and name != module)


def render() -> str:
    """The floors as docs/architecture.md lists them, lowest first."""
    lines = []
    for number, (module, what) in enumerate(FLOORS, 1):
        short = module.removeprefix("govflow.engine.")
        below = ", ".join(f"`{m.removeprefix('govflow.engine.')}`" for m in core_imports(module))
        lines.append(f"{number}. `{short}` — {what}; imports {below or 'none of these'}")
    return "\n".join(lines)


def upward_imports() -> list[str]:
    return [
        f"{module} imports {other}"
        for position, module in enumerate(CORE)
        for other in core_imports(module)
        if CORE.index(other) > position
    ]


def test_every_core_module_imports_only_floors_below_it():
    upward = upward_imports()
    assert not upward, f"imports that point up or round (a circle): {upward}"


def engine_modules() -> list[str]:
    package = ROOT / "govflow" / "engine"
    names = []
    for path in sorted(package.rglob("*.py")):
        if "migrations" in path.parts or path.name == "__init__.py":
            continue
        names.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return names


def circles(modules: list[str]) -> list[list[str]]:
    """The import circles among ``modules`` (strongly connected groups of two or more)."""
    edges = {m: [n for n in imported(m) if n in modules and n != m] for m in modules}
    order, low, stack, found, counter = {}, {}, [], [], [0]

    def visit(module: str) -> None:
        order[module] = low[module] = counter[0]
        counter[0] += 1
        stack.append(module)
        for other in edges[module]:
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in modules:
        if module not in order:
            visit(module)
    return found


def test_no_module_of_the_engine_is_part_of_an_import_circle():
    assert circles(engine_modules()) == []


def test_the_core_reaches_the_recovery_core_only_through_its_api():
    inner = {
        module: sorted(
            name
            for name in imported(module)
            if name.startswith("recovery") and not name.startswith("recovery.api")
        )
        for module in CORE
    }
    assert not any(inner.values()), {m: names for m, names in inner.items() if names}


def test_architecture_doc_shows_the_floors_as_they_are():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert render() in doc, f"regenerate the list in docs/architecture.md:\n{render()}"


def test_a_planted_upward_import_is_found_even_inside_a_function(tmp_path, monkeypatch):
    for module in CORE:
        copy = tmp_path.joinpath(*module.split(".")).with_suffix(".py")
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(path_of(module).read_text())
    planted = tmp_path.joinpath("govflow", "engine", "services", "run.py")
    planted.write_text(planted.read_text() + "\n\ndef _late():\n    from .steps import run_token\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert upward_imports() == ["govflow.engine.services.run imports govflow.engine.services.steps"]


if __name__ == "__main__":
    print(render())
