"""Publish the workflow definitions that installed apps ship in ``workflows/*.json``."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from govflow.engine.definitions import DefinitionInvalid
from govflow.engine.errors import DefinitionConflict
from govflow.engine.services.definitions import (
    app_workflow_files,
    definition_load_file,
)


def _shown(path: Path) -> str:
    # A path the file system could not decode would fail again when printed.
    return str(path).encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class Command(BaseCommand):
    help = (
        "Publish workflow definitions from every installed app's workflows/*.json (or "
        "the given files). Re-loading identical files is a no-op; a changed file under "
        "an already published version is refused: give it a new version."
    )

    def add_arguments(self, parser):
        parser.add_argument("files", nargs="*", help="definition files (default: all apps')")

    def handle(self, *args, files, **options):
        paths = [Path(f) for f in files] or list(app_workflow_files())
        failures = 0
        for path in paths:
            try:
                definition = definition_load_file(path)
            except DefinitionInvalid as exc:
                failures += 1
                # One line per file: the problems already name the file, the path says where.
                prefix = f"{path.name}: "
                problems = "; ".join(p.removeprefix(prefix) for p in exc.problems)
                self.stderr.write(f"{_shown(path)}: {problems}")
                continue
            except DefinitionConflict as exc:
                failures += 1
                self.stderr.write(f"{_shown(path)}: {exc}")
                continue
            self.stdout.write(
                f"{definition.key} v{definition.version} "
                f"({definition.fingerprint[:12]}…) from {path.name}"
            )
        if failures:
            raise CommandError(f"{failures} definition file(s) were not published.")
