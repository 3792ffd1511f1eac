"""``bench/instructions.py``'s arithmetic: per step is the K run's count less the warm-up's.

The benchmark itself runs PostgreSQL and Python under callgrind for minutes; this gives its
report made-up callgrind files of the format valgrind writes, read by the real
``callgrind_annotate``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import instructions

pytestmark = pytest.mark.skipif(
    shutil.which("callgrind_annotate") is None,
    reason="callgrind_annotate comes with Debian's valgrind package (.ci/run installs it)",
)


def callgrind(path: Path, costs: dict[str, int], calls: dict[str, tuple[str, int]]) -> Path:
    """A callgrind output: each function's own instructions; ``calls`` maps a caller to
    (callee, the callee's instructions under that call)."""
    lines = ["# callgrind format", "version: 1", "creator: test", "events: Ir", ""]
    lines += ["ob=/usr/lib/postgresql/15/bin/postgres", "fl=???"]
    for name, own in costs.items():
        lines += [f"fn={name}", f"0 {own}"]
        if name in calls:
            callee, inclusive = calls[name]
            lines += [f"cfn={callee}", "calls=1 0", f"0 {inclusive}"]
        lines.append("")
    lines.append(f"totals: {sum(costs.values())}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_per_step_figures_are_the_k_runs_counts_less_the_warm_ups(tmp_path, monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(instructions, "say", lambda text="": said.append(text))
    client0 = callgrind(tmp_path / "c0", {"main": 1_000_000}, {})
    client_k = callgrind(tmp_path / "ck", {"main": 1_000_000 + 10 * 5 * 4_000}, {})
    server0 = callgrind(
        tmp_path / "s0",
        {"PostgresMain": 50_000, "standard_ExecutorStart": 20_000, "json_lex": 5_000},
        {"PostgresMain": ("standard_ExecutorStart", 20_000)},
    )
    server_k = callgrind(
        tmp_path / "sk",
        {"PostgresMain": 150_000, "standard_ExecutorStart": 70_000, "json_lex": 30_000},
        {"PostgresMain": ("standard_ExecutorStart", 70_000)},
    )
    instructions.report({0: (client0, server0), 10: (client_k, server_k)}, k=10, top=2)
    text = "\n".join(said)
    # 50 steps: the client's 200,000 more are 4,000 per step; the server's 175,000 more
    # are 3,500 per step, of which the executor's set-up 1,000 (29%) and json_lex 500.
    assert "10 claimed five-step instances (start, claim, run), 50 steps" in text
    assert "4,000" in text and "3,500" in text and "7,500" in text
    lines = text.splitlines()
    executor = next(line for line in lines if line.strip().startswith("executor set-up"))
    assert "1,000" in executor and "29%" in executor, text
    top = said[-1].splitlines()
    assert top[2].split()[:2] == ["PostgresMain", "2,000"], top
    assert top[3].split()[:2] == ["standard_ExecutorStart", "1,000"], top
    assert len(top) == 4  # the two asked for: json_lex is left out


def test_a_missing_count_is_an_error_that_names_the_file(tmp_path):
    unfinished = tmp_path / "server.123"
    unfinished.write_text("events: Ir\nfn=main\n0 5\n")
    with pytest.raises(SystemExit, match=r"server\.123 has no totals"):
        instructions.total(unfinished)


def test_the_executor_set_up_is_split_by_the_nodes_it_builds(tmp_path, monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(instructions, "say", lambda text="": said.append(text))
    client = callgrind(tmp_path / "c", {"main": 10}, {})
    server0 = callgrind(tmp_path / "s0", {"PostgresMain": 10}, {})
    server_k = callgrind(
        tmp_path / "sk",
        {"PostgresMain": 1_000, "standard_ExecutorStart": 3_000, "ExecInitLockRows": 1_000},
        {
            "PostgresMain": ("standard_ExecutorStart", 4_000),
            "standard_ExecutorStart": ("ExecInitLockRows", 1_000),
        },
    )
    instructions.report({0: (client, server0), 2: (client, server_k)}, k=2, top=1)
    lines = "\n".join(said).splitlines()
    # 10 steps, 499 instructions each at the server: the set-up 400 of them, row locks 100.
    executor = next(line for line in lines if line.strip().startswith("executor set-up"))
    locks = next(line for line in lines if "row locks" in line)
    assert "400" in executor and "80%" in executor, lines
    assert "ExecInitLockRows" in locks and "100" in locks and "20%" in locks, lines


def test_kept_files_are_each_runs_client_and_server_counts(tmp_path, monkeypatch):
    monkeypatch.setattr(instructions, "say", lambda text="": None)
    runs = {}
    for n in (0, 20):
        client = callgrind(tmp_path / f"c{n}", {"main": n + 1}, {})
        server = callgrind(tmp_path / f"s{n}", {"PostgresMain": n + 2}, {})
        runs[n] = (client, server)
    instructions.keep(runs, tmp_path / "kept" / "here")
    kept = sorted(p.name for p in (tmp_path / "kept" / "here").iterdir())
    assert kept == ["client.0", "client.20", "server.0", "server.20"]
    assert instructions.total(tmp_path / "kept" / "here" / "server.20") == 22
