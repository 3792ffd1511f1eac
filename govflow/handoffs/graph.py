"""A definition drawn as a graph: a small layered layout, rendered as SVG on the server.

Each node goes to the layer of its shortest distance from the start (so loops back do not
stretch the drawing); nodes no path reaches go last. No JavaScript: the SVG is inline in
the page, each node's full title and state in its ``<title>`` (shown on hover).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

from django.utils.html import escape, format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext as _

BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 170, 44, 24, 36, 12
# Steps in these states are where the instance is now.
CURRENT = {"ready", "executing", "waiting", "outcome_unknown", "failed"}
FILL = {"current": "#ffe8a3", "done": "#dff0d8", "": "#f8f8f8"}
STROKE = {"current": "#ba2121", "done": "#417690", "": "#999999"}


def layers(start: str, nodes: Iterable[str], outgoing: Mapping) -> list[list[str]]:
    """Node ids by layer: breadth-first distance from ``start``; the unreached last."""
    order = list(nodes)
    depth = {start: 0} if start in order else {}
    queue = deque(depth)
    while queue:
        node = queue.popleft()
        for edge in outgoing.get(node, ()):
            if edge.target not in depth:
                depth[edge.target] = depth[node] + 1
                queue.append(edge.target)
    last = max(depth.values(), default=-1) + 1
    result: list[list[str]] = [[] for _ in range(last + 1)]
    for node in order:
        result[depth.get(node, last)].append(node)
    return [layer for layer in result if layer]


def definition_svg(spec, titles: Mapping[str, str], states: Mapping[str, str]) -> SafeString:
    """The SVG of ``spec``'s nodes and transitions; ``states`` maps a node to the state of
    its newest step (current ones highlighted, completed ones marked)."""
    grid = layers(spec.start, spec.nodes, spec.outgoing)
    if not grid:
        return SafeString("")
    width = max(len(layer) for layer in grid) * (BOX_W + GAP_X) - GAP_X + 2 * PAD
    height = len(grid) * (BOX_H + GAP_Y) - GAP_Y + 2 * PAD
    pos = {}
    for row, layer in enumerate(grid):
        offset = (width - 2 * PAD - (len(layer) * (BOX_W + GAP_X) - GAP_X)) / 2
        for col, node in enumerate(layer):
            pos[node] = (PAD + offset + col * (BOX_W + GAP_X), PAD + row * (BOX_H + GAP_Y))
    edges = [
        _edge(pos[e.source], pos[e.target])
        for source in spec.nodes
        for e in spec.outgoing.get(source, ())
        if e.source in pos and e.target in pos
    ]
    boxes = [_box(node, pos[node], titles, states.get(node, "")) for node in pos]
    return format_html(
        '<svg class="govflow-graph" role="img" xmlns="http://www.w3.org/2000/svg" '
        'viewBox="0 0 {w} {h}" width="{w}" height="{h}" aria-label="{label}">'
        '<defs><marker id="govflow-arrow" viewBox="0 0 10 10" refX="10" refY="5" '
        'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M 0 0 L 10 5 L 0 10 z" fill="#666"/></marker></defs>{edges}{boxes}</svg>',
        w=int(width),
        h=int(height),
        label=_("The definition's nodes and transitions; current steps are highlighted."),
        edges=SafeString("".join(edges)),
        boxes=SafeString("".join(boxes)),
    )


def _edge(a: tuple[float, float], b: tuple[float, float]) -> str:
    x1, y1 = a[0] + BOX_W / 2, a[1] + BOX_H
    x2, y2 = b[0] + BOX_W / 2, b[1]
    if y2 <= a[1]:  # back to an earlier layer: leave from the side, arrive at the side
        x1, y1, x2, y2 = a[0] + BOX_W, a[1] + BOX_H / 2, b[0] + BOX_W, b[1] + BOX_H / 2
        bend = max(x1, x2) + GAP_X / 2
        return format_html(
            '<path d="M {} {} C {} {} {} {} {} {}" fill="none" stroke="#666" '
            'marker-end="url(#govflow-arrow)"/>',
            x1,
            y1,
            bend,
            y1,
            bend,
            y2,
            x2,
            y2,
        )
    return format_html(
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#666" marker-end="url(#govflow-arrow)"/>',
        x1,
        y1,
        x2,
        y2,
    )


# One node's box; the numbers are the layout's own, the three texts are escaped. Written
# with str.format: format_html escaped every number of every box (a fifth of the time of
# an instance page of 200 steps went into this drawing).
BOX = (
    '<g class="govflow-node {mark}" data-node="{node}"><title>{hover}</title>'
    '<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" fill="{fill}" stroke="{stroke}" '
    'stroke-width="{sw}"/><text x="{tx}" y="{ty}" text-anchor="middle" font-size="12" '
    'fill="#333">{text}</text></g>'
)


def _box(node: str, at: tuple[float, float], titles: Mapping[str, str], state: str) -> str:
    mark = "current" if state in CURRENT else "done" if state == "completed" else ""
    title = titles.get(node, node)
    hover = f"{title} ({state.replace('_', ' ')})" if state else title
    return BOX.format(
        mark=mark,
        node=escape(node),
        hover=escape(hover),
        x=at[0],
        y=at[1],
        w=BOX_W,
        h=BOX_H,
        fill=FILL[mark],
        stroke=STROKE[mark],
        sw=3 if mark == "current" else 1,
        tx=at[0] + BOX_W / 2,
        ty=at[1] + BOX_H / 2 + 4,
        text=escape(title if len(title) <= 24 else Truncator(title).chars(24)),
    )


def node_states(tokens: Iterable) -> dict[str, str]:
    """Each node's newest step state (tokens in creation order)."""
    return {t.node_id: t.state for t in tokens}


__all__ = ["definition_svg", "layers", "node_states"]
