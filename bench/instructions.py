"""Instructions per step, client and server: what a step costs, counted instead of timed.

    make bench ARGS="--only instructions"
    .venv/bin/python bench/instructions.py [--instances K] [--top N] [--keep DIR]

Times on a shared virtual machine move by a third between identical runs (other tenants,
the hypervisor taking the CPU away: ``steal`` in ``/proc/stat``), far more than most
changes to the engine. Instructions do not: valgrind's callgrind counts the instructions a
process executes, the same for the same code and inputs whatever else the machine does.

What runs: a throwaway PostgreSQL server (``scripts/pg-server``) migrates a database and
stops; the same server is started again under callgrind (every process it forks counted
apart). The client (``bench/engine/instructions_client.py``), itself under callgrind, runs
claimed five-step no-op instances in-process as a worker does: start, claim, run. It runs
twice, with 0 and with K instances after the same warm-up; the difference between the two
runs, of the client process and of the server process that served it, is what K instances
cost. Printed: instructions per step of each, and where the server's go (its functions by
instructions of their own, and a few named parts with everything they call). Kernel work
(round trips, WAL flushes) is not counted: ``bench/engine_vs_dbos.py`` counts round trips
and commits.

Needs valgrind (Debian's ``valgrind`` package, which has ``callgrind_annotate``). About three
minutes: under callgrind a process runs some 50 times slower. Exits 0 when it measured,
1 when it could not.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.engine.govflow_side import django_env
from bench.pgserver import PG_SERVER, _as_owner, _pg_bin
from bench.report import save_targets, say, table

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "bench" / "engine" / "instructions_client.py"
STEPS = 5  # actions per instance of the five no-op steps' definition
READY_TIMEOUT = 300  # s: a server under callgrind starts slowly on a busy machine

PARTS = (
    ("executor set-up of each statement run", "standard_ExecutorStart"),
    ("set-up of INSERT and UPDATE nodes", "ExecInitModifyTable"),
    ("set-up of Result nodes (VALUES rows, one-time filters)", "ExecInitResult"),
    ("set-up of index scans", "ExecInitIndexScan"),
    ("set-up of row locks (FOR SHARE, FOR UPDATE)", "ExecInitLockRows"),
    ("PL/pgSQL ledger functions (all they run)", "plpgsql_call_handler"),
    ("JSON parsing (jsonb and json parameters)", "pg_parse_json"),
    ("index entries written", "ExecInsertIndexTuples"),
    ("planning", "standard_planner"),
    ("foreign keys checked on insert", "RI_FKey_check_ins"),
    ("commits", "CommitTransactionCommand"),
    ("WAL records", "XLogInsert"),
)
"""Named parts of the server's work, each with everything it calls (they overlap: the
ledger functions' statements have executor set-ups and index entries of their own)."""


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=20, help="K (default 20)")
    parser.add_argument("--top", type=int, default=15, help="server functions shown")
    parser.add_argument("--quick", action="store_true", help="K = 10")
    parser.add_argument("--targets-json", metavar="PATH", help="for bench/run.py (none)")
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="copy the four callgrind files (client and server, 0 and K instances) to DIR, "
        "for callgrind_annotate or kcachegrind",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.instances = 10
    if args.instances < 1:
        parser.error("--instances must be at least 1")
    return args


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def migrated_server(directory: Path, log: Path) -> Path:
    """A stopped server in ``directory`` with database ``instructions`` migrated."""
    started = subprocess.run(
        [str(PG_SERVER), "start", str(directory)], capture_output=True, text=True
    )
    urls = [ln for ln in started.stdout.splitlines() if ln.startswith("DATABASE_URL=")]
    if started.returncode != 0 or not urls:
        raise SystemExit(f"scripts/pg-server could not start a server:\n{started.stderr[-2000:]}")
    url = urls[-1].removeprefix("DATABASE_URL=")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE instructions")
        env = client_env(url.rsplit("/", 1)[0] + "/instructions")
        with open(log, "ab") as out:
            migrated = subprocess.run(
                [sys.executable, str(ROOT / "manage.py"), "migrate", "--verbosity", "0"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        if migrated.returncode != 0:
            raise SystemExit(f"manage.py migrate failed; see {log}")
    finally:  # stopped cleanly (not scripts/pg-server stop, which removes the folder)
        pg_ctl = [str(_pg_bin() / "pg_ctl"), "-D", str(directory / "data"), "-m", "fast"]
        subprocess.run(_as_owner([*pg_ctl, "-w", "stop"]), capture_output=True)
    return directory / "data"


def client_env(url: str) -> dict[str, str]:
    """The engine bench's environment for a process on ``url`` (settings, anchors), with
    a fixed hash seed (the same dict orders, so the same instructions) and less logging."""
    return {**django_env(url), "PYTHONHASHSEED": "0", "GOVFLOW_LOG_LEVEL": "WARNING"}


def counted_server(data: Path, out: Path, port: int) -> subprocess.Popen:
    """The server on ``data`` under callgrind, one output file per process it forks."""
    pg_bin = _pg_bin()
    argv = [
        "valgrind", "--tool=callgrind", "--trace-children=yes",
        f"--callgrind-out-file={out}/server.%p",
        str(pg_bin / "postgres"), "-D", str(data), "-p", str(port), "-k", str(data.parent),
        "-c", "listen_addresses=127.0.0.1", "-c", "autovacuum=off",
        "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
    ]  # fmt: skip
    log = open(data.parent / "counted.log", "ab")  # noqa: SIM115 (the server's own log)
    return subprocess.Popen(_as_owner(argv), stdout=log, stderr=log, start_new_session=True)


def wait_ready(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server under callgrind exited ({server.returncode})")
        try:
            with psycopg.connect(url, connect_timeout=5):
                return
        except psycopg.OperationalError:
            time.sleep(0.5)
    raise SystemExit(f"the server under callgrind did not accept connections in {READY_TIMEOUT} s")


def run_client(url: str, n: int, out: Path) -> tuple[int, Path]:
    """Run the client under callgrind on a fresh copy of the migrated database; return
    the pid of the server process that served it and the client's own output file."""
    name = f"instructions_{n}"
    with psycopg.connect(f"{url}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE instructions")
    client_out = out / f"client.{n}"
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={client_out}",
         sys.executable, str(CLIENT), str(n)],
        cwd=ROOT, env=client_env(f"{url}/{name}"), capture_output=True, text=True,
    )  # fmt: skip
    backend = re.search(r"^BACKEND (\d+)$", done.stdout, re.M)
    if done.returncode != 0 or backend is None:
        raise SystemExit(f"the client failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return int(backend.group(1)), client_out


def functions(path: Path, inclusive: bool) -> dict[str, int]:
    """Instructions per function of one callgrind output (``callgrind_annotate``)."""
    argv = ["callgrind_annotate", "--threshold=100", str(path)]
    text = subprocess.run(
        argv + (["--inclusive=yes"] if inclusive else []), capture_output=True, text=True
    ).stdout
    found: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(?:\S*:)?([^ :\[]+)(?: \[.*)?$", line)
        if m:
            found[m.group(2)] = found.get(m.group(2), 0) + int(m.group(1).replace(",", ""))
    return found


def total(path: Path) -> int:
    m = re.search(r"^totals: (\d+)", path.read_text(errors="replace"), re.M)
    if m is None:
        raise SystemExit(f"{path} has no totals: callgrind did not finish")
    return int(m.group(1))


def wait_written(path: Path, timeout: float = 120) -> Path:
    """A server process writes its counts when it ends (its client disconnected)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and re.search(r"^totals: ", path.read_text(errors="replace"), re.M):
            return path
        time.sleep(0.2)
    raise SystemExit(f"the server process's counts ({path}) were not written in {timeout} s")


def report(runs: dict[int, tuple[Path, Path]], k: int, top: int) -> None:
    steps = k * STEPS
    (client0, server0), (client_k, server_k) = runs[0], runs[k]
    client = (total(client_k) - total(client0)) / steps
    server = (total(server_k) - total(server0)) / steps
    say(f"{k} claimed five-step instances (start, claim, run), {steps} steps; per step:")
    say(table(("process", "instructions per step"), [
        ("client (the worker's Python: engine, Django, psycopg)", f"{client:,.0f}"),
        ("server (the PostgreSQL process serving it)", f"{server:,.0f}"),
        ("both", f"{client + server:,.0f}"),
    ], set()))  # fmt: skip
    incl0, incl_k = functions(server0, True), functions(server_k, True)
    rows = []
    for label, symbol in PARTS:
        per_step = (incl_k.get(symbol, 0) - incl0.get(symbol, 0)) / steps
        rows.append((label, symbol, f"{per_step:,.0f}", f"{per_step / server:.0%}"))
    say("\nThe server's parts, each with everything it calls (they overlap):")
    say(table(("part", "function", "per step", "of the server's"), rows, set()))
    self0, self_k = functions(server0, False), functions(server_k, False)
    own = {name: (self_k.get(name, 0) - self0.get(name, 0)) / steps for name in self_k}
    ranked = sorted(own.items(), key=lambda item: -item[1])[:top]
    say(f"\nThe server's {top} costliest functions by instructions of their own, per step:")
    say(table(("function", "per step", "of the server's"), [
        (name, f"{n:,.0f}", f"{n / server:.1%}") for name, n in ranked
    ], set()))  # fmt: skip


def stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGINT)  # fast shutdown
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def keep(runs: dict, folder: Path) -> None:
    """Copy each run's callgrind files to ``folder`` (``client.N``, ``server.N``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for n, (client_out, server_out) in runs.items():
        shutil.copyfile(client_out, folder / f"client.{n}")
        shutil.copyfile(server_out, folder / f"server.{n}")
    say(f"callgrind files kept in {folder}")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    missing = [tool for tool in ("valgrind", "callgrind_annotate") if not shutil.which(tool)]
    if missing or _pg_bin() is None:
        say(f"bench/instructions.py needs {', '.join(missing) or 'a PostgreSQL server'}: "
            "install Debian's 'valgrind' (and 'postgresql') package.")  # fmt: skip
        return 1
    parent = Path(tempfile.mkdtemp(prefix="govflow-instructions-"))
    os.chmod(parent, 0o711)  # the server runs as 'postgres' when we are root
    out = parent / "callgrind"
    out.mkdir(mode=0o777)
    out.chmod(0o777)  # the server's processes write their counts here
    started = time.monotonic()
    try:
        say("migrating a throwaway server's database, then starting it under callgrind")
        data = migrated_server(parent / "server", parent / "migrate.log")
        port = free_port()
        server = counted_server(data, out, port)
        url = f"postgres://govflow@127.0.0.1:{port}"
        try:
            wait_ready(f"{url}/postgres", server)
            runs = {}
            for n in (0, args.instances):
                say(f"client under callgrind: warm-up, then {n} instances")
                backend, client_out = run_client(url, n, out)
                runs[n] = (client_out, wait_written(out / f"server.{backend}"))
        finally:
            stop(server)
        say()
        report(runs, args.instances, args.top)
        if args.keep:
            keep(runs, Path(args.keep))
        say(f"\n(measured in {time.monotonic() - started:.0f} s)")
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    if args.targets_json:
        save_targets(args.targets_json, [])  # figures to compare, no target of their own
    return 0


if __name__ == "__main__":
    sys.exit(main())
