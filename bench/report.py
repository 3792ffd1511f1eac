"""Printing: aligned tables and the targets with their verdicts."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass


def say(text: str = "") -> None:
    print(text, flush=True)


def table(header: Sequence[str], rows: Sequence[Sequence[object]], right: set[int]) -> str:
    """Return an aligned, indented table; columns in ``right`` are right-aligned."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for n, row in enumerate(cells):
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append(("  " + "  ".join(parts)).rstrip())
        if n == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@dataclass(frozen=True)
class Target:
    figure: str
    value: str
    target: str
    met: bool | None
    """None: no figure to judge (counted as not met)."""

    @property
    def status(self) -> str:
        return "MET" if self.met else "NOT MET"


def save_targets(path: str, targets: Iterable[Target | Sequence]) -> None:
    """Write targets (``Target`` or (figure, value, target, met)) as JSON for bench/run.py."""
    rows = [asdict(t) if isinstance(t, Target) else asdict(Target(*t)) for t in targets]
    with open(path, "w") as out:
        json.dump(rows, out)


def load_targets(path: str) -> list[Target]:
    with open(path) as src:
        return [Target(**row) for row in json.load(src)]


def verdicts(targets: Sequence[Target], notes: Sequence[Sequence[str]]) -> str:
    """The results table (targets, then reference rows) and the one-line summary."""
    rows = [(t.figure, t.value, t.target, t.status) for t in targets]
    rows += [tuple(note) for note in notes]
    missed = [t for t in targets if not t.met]
    if missed:
        summary = (
            f"SUMMARY: {len(targets) - len(missed)} of {len(targets)} targets met; "
            "NOT MET: " + "; ".join(f"{t.figure} = {t.value} (target {t.target})" for t in missed)
        )
    else:
        summary = f"SUMMARY: all {len(targets)} targets met."
    return table(("figure", "value", "target", "status"), rows, {1}) + "\n\n" + summary
