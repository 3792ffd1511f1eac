"""Print the modules over 400 lines and the functions over 60 lines; fail on new ones.

The limits are the style guide's (docs/architecture.md, "Sizes"): a module grows into a
package, a function into smaller ones, before either gets hard to read. Tests, the bench
and migrations are not measured. A function counts from its ``def`` to its last line,
docstring and nested functions included; a module counts all its lines.

The offenders named in ``ALLOWED`` below, each with the sentence that says why it may
stay for now, pass; any other one fails, so ``make lint`` stops a new long function or
module where it is written. An allowance for an offender that has been fixed fails too,
so the list cannot go stale. Failures are printed, and ``--all`` prints the allowed
offenders as well. Run from the repository root:

    .venv/bin/python scripts/sizes.py [--all]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEASURED = ("govflow", "recovery", "scripts")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

# "path" for a module, "path:qualified.name" for a function: why each may stay for now
# (none does today; an entry needs a sentence saying why and until when).
ALLOWED: dict[str, str] = {}


def _measured(root: Path) -> list[Path]:
    return sorted(
        path
        for folder in MEASURED
        for path in (root / folder).rglob("*.py")
        if "migrations" not in path.relative_to(root).parts
    )


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, first line, last line) of every function, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                yield name, node.lineno, node.end_lineno
            yield from _functions(node, f"{name}.")
        else:
            yield from _functions(node, prefix)


def offenders(root: Path = ROOT) -> list[tuple[str, int, int]]:
    """(key, lines, limit) for every module and function over its limit."""
    found = []
    for path in _measured(root):
        relative = path.relative_to(root).as_posix()
        source = path.read_text(encoding="utf-8")
        length = len(source.splitlines())
        if length > MAX_MODULE_LINES:
            found.append((relative, length, MAX_MODULE_LINES))
        for name, first, last in _functions(ast.parse(source, relative)):
            if last - first + 1 > MAX_FUNCTION_LINES:
                found.append((f"{relative}:{name}", last - first + 1, MAX_FUNCTION_LINES))
    return found


def report(
    root: Path = ROOT, allowed: dict[str, str] = ALLOWED, *, every: bool = False
) -> tuple[list[str], bool]:
    """The lines to print, and whether the sizes pass. ``every``: the allowed ones too."""
    lines, ok = [], True
    found = offenders(root)
    for key, length, limit in found:
        why = allowed.get(key)
        if why is None:
            ok = False
            how = "into smaller functions" if ":" in key else "into a package of modules"
            lines.append(
                f"TOO LONG {key}: {length} lines, more than {limit}. Split it {how}, or "
                "add it to ALLOWED in scripts/sizes.py with a sentence saying why it may stay."
            )
        elif every:
            lines.append(f"allowed  {key}: {length} lines ({why})")
    for key in sorted(set(allowed) - {key for key, _, _ in found}):
        ok = False
        lines.append(
            f"FIXED    {key} is within its limit now: remove it from ALLOWED in scripts/sizes.py."
        )
    if ok:
        but = f", but the {len(allowed)} allowed in scripts/sizes.py" if allowed else ""
        lines.append(
            f"sizes: no module over {MAX_MODULE_LINES} lines, no function over "
            f"{MAX_FUNCTION_LINES}{but} (--all lists them)"
        )
    return lines, ok


def main(argv: list[str]) -> int:
    lines, ok = report(every="--all" in argv)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
