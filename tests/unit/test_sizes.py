"""``scripts/sizes.py`` (in ``make lint``): long modules and functions fail unless allowed."""

from __future__ import annotations

from pathlib import Path

from scripts.sizes import MAX_FUNCTION_LINES, MAX_MODULE_LINES, report


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _function(name: str, lines: int, indent: str = "") -> str:
    """A function of exactly ``lines`` lines, ``def`` included."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))
    return f"{indent}def {name}():\n{body}"


def test_a_new_long_function_fails_with_its_qualified_name_and_what_to_do(tmp_path):
    _write(
        tmp_path,
        "govflow/engine/long.py",
        "class Desk:\n" + _function("handle", MAX_FUNCTION_LINES + 1, "    "),
    )
    _write(tmp_path, "recovery/short.py", _function("fine", MAX_FUNCTION_LINES))
    lines, ok = report(tmp_path, {})
    assert not ok
    assert lines == [
        f"TOO LONG govflow/engine/long.py:Desk.handle: {MAX_FUNCTION_LINES + 1} lines, more "
        f"than {MAX_FUNCTION_LINES}. Split it into smaller functions, or add it to ALLOWED in "
        "scripts/sizes.py with a sentence saying why it may stay."
    ]


def test_a_long_module_fails_but_tests_and_migrations_are_not_measured(tmp_path):
    long_module = "x = 1\n" * (MAX_MODULE_LINES + 1)
    _write(tmp_path, "recovery/big.py", long_module)
    _write(tmp_path, "recovery/migrations/0001_initial.py", long_module)
    _write(tmp_path, "tests/test_big.py", long_module)
    lines, ok = report(tmp_path, {})
    assert not ok
    assert len(lines) == 1
    assert lines[0].startswith(f"TOO LONG recovery/big.py: {MAX_MODULE_LINES + 1} lines")
    assert "into a package of modules" in lines[0]


def test_an_allowed_offender_passes_and_is_listed_with_its_reason_on_request(tmp_path):
    _write(tmp_path, "scripts/tool.py", _function("main", MAX_FUNCTION_LINES + 5))
    allowed = {"scripts/tool.py:main": "issue 99 work in progress changes this file"}
    lines, ok = report(tmp_path, allowed)
    assert ok
    assert lines[0].startswith("sizes: no module over")
    lines, ok = report(tmp_path, allowed, every=True)
    assert ok
    assert lines[0] == (
        f"allowed  scripts/tool.py:main: {MAX_FUNCTION_LINES + 5} lines "
        "(issue 99 work in progress changes this file)"
    )


def test_an_allowance_for_an_offender_that_was_fixed_fails_so_the_list_stays_true(tmp_path):
    _write(tmp_path, "govflow/ok.py", _function("main", 10))
    lines, ok = report(tmp_path, {"govflow/ok.py:main": "was long"})
    assert not ok
    assert lines == [
        "FIXED    govflow/ok.py:main is within its limit now: remove it from ALLOWED in "
        "scripts/sizes.py."
    ]


def test_the_project_itself_has_no_offender_but_the_allowed_ones():
    lines, ok = report()
    assert ok, "\n".join(lines)
