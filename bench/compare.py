"""GovFlow's throughput under two or more values of a setting, alternated, without DBOS.

    .venv/bin/python bench/compare.py GOVFLOW_SHARED_COMMIT_LINES=1,2
    .venv/bin/python bench/compare.py GOVFLOW_WORKER_RUNS=8,16 --workers 1,2 --rounds 4

``make bench`` measures GovFlow against DBOS in pairs, and a pair's ratio moves with both
engines' noise. To judge a change of GovFlow's own, this runs only GovFlow's throughput
scenario (``bench.engine.scenarios.govflow_throughput``: a real ``qcluster`` on a durable
server, five-step no-op instances), with the setting at each value in turn, round after
round, so that the machine's slow minutes fall on every value alike. Each run prints its
steps/s, the CPU per step of each cluster process and of the server, commits per step and
the CPU the hypervisor took (steal); the end prints each value's mean and its runs.

The setting reaches the cluster through the environment (``govflow.settings.base`` reads
``GOVFLOW_*`` from it). The server is ``make bench``'s kind (``bench.pgserver``): a
throwaway durable one, or ``DATABASE_URL``'s. Exits 0 when every run finished.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import engine_vs_dbos
from bench.engine import govflow_side as gf
from bench.engine import procs, scenarios
from bench.pgserver import BenchSetupError, postgres_server

SETTING = re.compile(r"^(GOVFLOW_[A-Z0-9_]+)=([^,]+(?:,[^,]+)+)$")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "setting",
        help="GOVFLOW_NAME=A,B[,…]: the setting and the values to compare (two or more)",
    )
    parser.add_argument("--workers", default="1", help="worker processes, e.g. 1,2 (default 1)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per value and worker count")
    parser.add_argument("--n", type=int, default=2000, help="instances per run (default 2000)")
    args = parser.parse_args(argv)
    found = SETTING.match(args.setting)
    if not found:
        parser.error(
            f"{args.setting!r} is not a setting with two or more values: write it as "
            "GOVFLOW_NAME=A,B, e.g. GOVFLOW_WORKER_RUNS=8,16"
        )
    args.name, args.values = found.group(1), found.group(2).split(",")
    if len(set(args.values)) != len(args.values):
        parser.error(f"{args.setting!r} names a value twice: give each value once")
    try:
        args.worker_counts = [int(w) for w in args.workers.split(",")]
    except ValueError:
        parser.error(f"--workers takes whole numbers separated by commas, not {args.workers!r}")
    if not args.worker_counts or min(args.worker_counts) < 1 or args.rounds < 1 or args.n < 1:
        parser.error("--workers, --rounds and --n must be positive")
    return args


def line(name: str, value: str, workers: int, round_: int, result: dict) -> str:
    """One run's figures on one line."""
    cpu = ", ".join(f"{role} {ms:.2f}" for role, ms in sorted(result["cpu"].items()) if ms)
    per_step = result["per_step"]
    server = per_step["server_cpu_ms"]
    return (
        f"{name}={value}, {workers} worker(s), round {round_ + 1}: "
        f"{result['steps_per_s']:.1f} steps/s; CPU ms per step: {cpu}"
        + (f", server {server:.2f}" if server is not None else "")
        + f"; commits per step {per_step['commits']:.2f}; steal {result['steal']:.1%}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="govflow-compare-logs-"))
    cfg = engine_vs_dbos.config(
        engine_vs_dbos.parse(["--only", "throughput", "--n", str(args.n), "--sample", "0"]),
        log_dir,
    )
    figures: dict[tuple[int, str], list[float]] = {}
    print(f"{args.name} = {', '.join(args.values)}; logs in {log_dir}", flush=True)
    try:
        with postgres_server(statements=True) as server:
            try:
                gf.setup_django(server, "gf_template", log_dir)
                for round_ in range(args.rounds):
                    for workers in args.worker_counts:
                        for number, value in enumerate(args.values):
                            os.environ[args.name] = value
                            result = scenarios.govflow_throughput(
                                server,
                                cfg,
                                workers,
                                detail=False,
                                # a database of its own per run (its name's suffix)
                                pair=2 + (round_ * len(args.values) + number),
                            )
                            print(line(args.name, value, workers, round_, result), flush=True)
                            figures.setdefault((workers, value), []).append(result["steps_per_s"])
            finally:
                procs.kill_all()
    except BenchSetupError as exc:
        print(f"no server: {exc}", file=sys.stderr)
        return 1
    print()
    for (workers, value), runs in sorted(figures.items()):
        each = ", ".join(f"{x:.1f}" for x in runs)
        print(
            f"{workers} worker(s), {args.name}={value}: "
            f"mean {sum(runs) / len(runs):.1f} steps/s ({each})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
