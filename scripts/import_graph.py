"""Print the app-level import graph of GovFlow, as docs/architecture.md shows it.

Each line is one app and the apps it imports (direct imports, from the modules' source,
with grimp, the graph import-linter checks). For the recovery core, the modules of it that
the others import are named, so the one door shows. Run from the repository root:

    .venv/bin/python scripts/import_graph.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
# The apps, most specific first: a module belongs to the first app whose name prefixes it.
APPS = (
    "govflow.engine",
    "govflow.handoffs",
    "govflow.api",
    "govflow.demo",
    "govflow.events",
    "govflow.settings",
    "recovery",
    "govflow",
)


def app_of(module: str) -> str:
    return next(app for app in APPS if module == app or module.startswith(app + "."))


def graph_lines() -> list[str]:
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph("govflow", "recovery", cache_dir=None)
    edges: dict[str, set[str]] = {}
    doors: set[str] = set()
    for module in graph.modules:
        importer = app_of(module)
        for imported in graph.find_modules_directly_imported_by(module):
            target = app_of(imported)
            if target == importer:
                continue
            edges.setdefault(importer, set()).add(target)
            if target == "recovery":
                doors.add(imported)
    lines = []
    for app in APPS:
        if app not in edges and not any(m == app or m.startswith(app + ".") for m in graph.modules):
            continue
        targets = ", ".join(sorted(edges.get(app, ()))) or "(nothing of GovFlow)"
        lines.append(f"{app:<17} -> {targets}")
    lines.append(f"recovery modules imported from outside it: {', '.join(sorted(doors))}")
    return lines


if __name__ == "__main__":
    print("\n".join(graph_lines()))
