"""The content security policy allows no inline script: no template may need one.

Every template of the project (govflow/, recovery/, templates/) and the Django admin's own
templates are scanned. An inline ``<script>`` must carry the request's nonce; an event
handler attribute (``onclick=`` and the like) can never run under the policy and fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import django
import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PROJECT_TEMPLATES = sorted(
    p
    for folder in ("govflow", "recovery", "templates")
    for p in (ROOT / folder).rglob("*.html")
    if "templates" in p.parts
)
ADMIN_TEMPLATES = sorted((Path(django.__file__).parent / "contrib" / "admin").rglob("*.html"))

SCRIPT = re.compile(r"<script\b([^>]*)>(.*?)</script\s*>", re.IGNORECASE | re.DOTALL)
HANDLER = re.compile(r"<[a-z][^>]*?\son[a-z]+\s*=", re.IGNORECASE | re.DOTALL)
NONCE = re.compile(r"""\bnonce\s*=\s*["']\{\{\s*request\.csp_nonce\s*\}\}["']""")


def problems(text: str) -> list[str]:
    found = []
    for attrs, body in SCRIPT.findall(text):
        if "src=" in attrs.replace(" ", ""):
            continue
        if re.search(r"type\s*=\s*[\"']application/(ld\+)?json", attrs) or not body.strip():
            continue  # data, not code
        if not NONCE.search(attrs):
            found.append(f"inline <script> without the CSP nonce: {body.strip()[:60]!r}")
    found += [f"event handler attribute: {m.group(0)[-40:]!r}" for m in HANDLER.finditer(text)]
    return found


@pytest.mark.parametrize("path", PROJECT_TEMPLATES, ids=lambda p: str(p.relative_to(ROOT)))
def test_project_templates_have_no_inline_script(path):
    assert not problems(path.read_text()), f"{path.relative_to(ROOT)}: {problems(path.read_text())}"


def test_the_django_admin_templates_have_no_inline_script():
    bad = {str(p.name): problems(p.read_text()) for p in ADMIN_TEMPLATES if problems(p.read_text())}
    assert not bad, f"Django's admin templates need inline script: {bad}"


@pytest.mark.parametrize(
    ("snippet", "bad"),
    [
        ("<script>alert(1)</script>", True),
        ('<script nonce="{{ request.csp_nonce }}">go()</script>', False),
        ('<script src="{% static "x.js" %}"></script>', False),
        ('<button onclick="go()">Go</button>', True),
        ('<a href="#" onMouseOver = "go()">x</a>', True),
        ('<p class="online">one=1</p>', False),
    ],
)
def test_the_scan_tells_inline_script_from_allowed_markup(snippet, bad):
    assert bool(problems(snippet)) is bad


def test_the_scan_covers_the_desk_templates():
    assert len(PROJECT_TEMPLATES) >= 5
