"""The graph of a definition as a whole: one start, reachability, joins, gateway loops."""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Mapping
from typing import Any

from .limits import MAX_GATEWAY_CHAIN, PASS_THROUGH

Problems = list[str]


def reachable(start: str, outgoing: Mapping[str, Any]) -> set[str]:
    """Every node a token can reach from ``start``."""
    seen, queue = {start}, deque([start])
    while queue:
        for t in outgoing.get(queue.popleft(), ()):
            if t.target not in seen:
                seen.add(t.target)
                queue.append(t.target)
    return seen


def check_graph(nodes, outgoing, incoming, problems: Problems) -> None:
    """Check the graph ``nodes``/``outgoing``/``incoming`` make (transitions are checked)."""
    starts = [n for n, node in nodes.items() if node["type"] == "start"]
    if len(starts) != 1:
        problems.append(f"a definition has exactly one start node (found {len(starts)}).")
        return
    if not any(node["type"] == "end" for node in nodes.values()):
        problems.append("a definition needs at least one end node.")
    for node_id, node in nodes.items():
        _check_edges(
            node_id, node["type"], outgoing.get(node_id, []), incoming.get(node_id, []), problems
        )
    seen = reachable(starts[0], outgoing)
    for node_id in nodes:
        if node_id not in seen:
            problems.append(f"node '{node_id}' is unreachable from the start node.")
    _check_joins(nodes, outgoing, incoming, problems)
    _check_pass_through(nodes, outgoing, problems)


def _check_edges(node_id: str, kind: str, out: list, into: list, problems: Problems) -> None:
    where = f"node '{node_id}'"
    if kind == "start" and into:
        problems.append(f"{where}: nothing may lead into the start node.")
    if kind == "end" and out:
        problems.append(f"{where}: an end node has no outgoing transitions.")
    if kind not in {"end", "exclusive", "parallel_split"} and len(out) != 1:
        problems.append(
            f"{where}: a {kind} node needs exactly one outgoing transition (found {len(out)})."
        )
    if kind != "exclusive" and any(t.when is not None or t.default for t in out):
        problems.append(f"{where}: only exclusive gateways have conditional transitions.")
    if kind == "exclusive":
        _check_exclusive(where, out, problems)
    if kind == "parallel_split" and len(out) < 2:
        problems.append(f"{where}: a parallel split needs at least two branches.")
    if kind == "parallel_join" and len(into) < 2:
        problems.append(f"{where}: a parallel join needs at least two incoming branches.")


def _check_exclusive(where: str, out: list, problems: Problems) -> None:
    defaults = [t for t in out if t.default]
    if not out:
        problems.append(f"{where}: an exclusive gateway needs outgoing transitions.")
    if len(defaults) > 1:
        problems.append(f"{where}: at most one default transition.")
    for t in out:
        if not t.default and t.when is None:
            problems.append(
                f"{where}: transition to '{t.target}' needs a 'when' condition or 'default': true."
            )


def _check_joins(nodes, outgoing, incoming, problems: Problems) -> None:
    splits = [n for n, node in nodes.items() if node["type"] == "parallel_split"]
    reach = functools.cache(lambda split: reachable(split, outgoing))
    for node_id, node in nodes.items():
        if node["type"] != "parallel_join":
            continue
        sources = {t.source for t in incoming.get(node_id, [])}
        if not any(sources <= reach(split) for split in splits):
            problems.append(
                f"node '{node_id}': a parallel join without its parallel split "
                "(no split leads to every incoming branch)."
            )


def _check_pass_through(nodes, outgoing, problems: Problems) -> None:
    loop = _pass_through_loop(nodes, outgoing)
    if loop:
        problems.append(
            f"nodes {' → '.join(loop)} form a loop of gateways with no step, "
            "timer or wait in between; an instance would go round it forever."
        )
        return
    chain, first = _longest_pass_through_chain(nodes, outgoing)
    if chain > MAX_GATEWAY_CHAIN:
        problems.append(
            f"node '{first}' starts a chain of {chain} gateways with no step, timer or "
            f"wait in between; at most {MAX_GATEWAY_CHAIN} are followed in a row. Merge "
            "the conditions into fewer gateways."
        )


def _pass_through_loop(nodes, outgoing) -> list[str]:
    """A cycle of nodes a token passes straight through (the router follows them at once).

    A depth-first search with an explicit stack: a definition's graph comes from outside,
    and a long chain of gateways must not exhaust the interpreter's stack here.
    """
    through = {n for n, node in nodes.items() if node["type"] in PASS_THROUGH}
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    for root in sorted(through):
        if root in state:
            continue
        state[root] = 1
        path = [root]
        pending = [iter(outgoing.get(root, ()))]
        while pending:
            for t in pending[-1]:
                if t.target not in through:
                    continue
                if state.get(t.target) == 1:
                    return [*path[path.index(t.target) :], t.target]
                if t.target not in state:
                    state[t.target] = 1
                    path.append(t.target)
                    pending.append(iter(outgoing.get(t.target, ())))
                    break
            else:
                state[path.pop()] = 2
                pending.pop()
    return []


def _longest_pass_through_chain(nodes, outgoing) -> tuple[int, str]:
    """The most gateways a token passes in a row, and the first of them (no loop assumed)."""
    through = {n for n, node in nodes.items() if node["type"] in PASS_THROUGH}
    length: dict[str, int] = {}
    for root in sorted(through):
        stack = [root]
        while stack:
            node_id = stack[-1]
            if node_id in length:
                stack.pop()
                continue
            after = [t.target for t in outgoing.get(node_id, ()) if t.target in through]
            todo = [n for n in after if n not in length]
            if todo:
                stack.extend(todo)
                continue
            length[node_id] = 1 + max((length[n] for n in after), default=0)
            stack.pop()
    if not length:
        return 0, ""
    first = max(sorted(length), key=lambda n: length[n])
    return length[first], first
