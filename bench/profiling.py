"""Where a lifecycle's time goes: one run under cProfile, summarised by area and function."""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable

AREAS = (
    ("psycopg: driver and waiting for the server", ("psycopg",)),
    ("recovery: ledger, chain, hashing glue", ("/recovery/",)),
    ("blake3 (C)", ("blake3",)),
    ("json (encode/decode)", ("/json/", "_json", "json.")),
    ("django: ORM connection, cursors, transactions", ("/django/",)),
)
KEY_FUNCTIONS = (
    ("operations.py", "operation_record"),
    ("operations.py", "operation_observe"),
    ("_ledger.py", "verified_head"),
    ("chain.py", "verify_rows"),
    ("chain.py", "append"),
    ("canonical.py", "canonical_bytes"),
    ("canonical.py", "fingerprint_value"),
    ("transaction.py", "__exit__"),
    ("utils.py", "execute"),
    ("base.py", "commit"),
)


def _area(filename: str, name: str) -> str:
    where = filename if filename != "~" else name
    for label, needles in AREAS:
        if any(needle in where for needle in needles):
            return label
    return "other Python (bench loop, builtins)"


def profile(work: Callable[[], object], lifecycles: int, top: int = 15) -> str:
    """Run ``work`` under cProfile; return a readable summary per lifecycle (µs)."""
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        work()
    finally:
        profiler.disable()
    stats = pstats.Stats(profiler)
    entries = stats.stats  # type: ignore[attr-defined]
    total = sum(tt for (_, _, _), (_, _, tt, _, _) in entries.items())
    per = 1e6 / lifecycles
    lines = [
        f"  cProfile of {lifecycles:,} lifecycles: {total * per:,.0f} µs per lifecycle "
        "(profiling inflates Python time)",
        "",
        "  self time by area            µs/lc   share",
    ]
    areas: dict[str, float] = {}
    for (filename, _, name), (_, _, tt, _, _) in entries.items():
        label = _area(filename, name)
        areas[label] = areas.get(label, 0.0) + tt
    for label, tt in sorted(areas.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {label:<48} {tt * per:>7,.0f}  {tt / total:>5.0%}")
    lines += ["", "  cumulative time of key functions              µs/lc   calls/lc"]
    for file_end, func in KEY_FUNCTIONS:
        for (filename, _, name), (_, nc, _, ct, _) in entries.items():
            if (
                name == func
                and filename.endswith(file_end)
                and ("/recovery/" in filename or "/django/" in filename)
            ):
                short = "/".join(filename.split("/")[-2:])
                lines.append(
                    f"    {short + ':' + func:<44} {ct * per:>7,.0f}   {nc / lifecycles:>6.1f}"
                )
    lines += ["", f"  top {top} functions by self time                 µs/lc   calls/lc"]
    ranked = sorted(entries.items(), key=lambda kv: -kv[1][2])[:top]
    for (filename, line, name), (_, nc, tt, _, _) in ranked:
        where = name if filename == "~" else f"{'/'.join(filename.split('/')[-2:])}:{line}:{name}"
        lines.append(f"    {where[:62]:<62} {tt * per:>7,.0f}   {nc / lifecycles:>6.1f}")
    return "\n".join(lines)
