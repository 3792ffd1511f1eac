"""Every user-visible string of the desk's templates is marked for translation.

The templates are read with Django's own template lexer: text outside ``{% translate %}``
and ``{% blocktranslate %}`` (tags, comments and template variables aside) must carry no
words, and neither may the attributes a person reads (``title``, ``aria-label``, ``alt``,
``placeholder``, a button's ``value``). A string added in English only fails here, naming
the template and the text; tests/integration/test_german_catalogue.py then makes sure the
German catalogue translates it.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.template.base import Lexer, TokenType

ROOT = Path(__file__).resolve().parents[2]
# The desk: the operators' admin pages of the engine, the recovery app, identity and the
# project's admin overrides. The API's Swagger/Redoc pages are the vendor's, in English.
DESK_TEMPLATES = sorted(
    path
    for folder in ("govflow", "recovery", "templates")
    for path in (ROOT / folder).rglob("*.html")
    if "drf_spectacular" not in path.parts
)
READ_ATTRIBUTES = ("title", "aria-label", "alt", "placeholder")
WORD = re.compile(r"[^\W\d_]{2,}")
# Not words for a translator: names of formats and algorithms, shown as they are.
NAMES = {"BLAKE", "JSON", "SVG"}
TRANSLATED = "\x00"  # stands for a template's output (a variable or a translation)


def _flatten(source: str) -> str:
    """``source`` as HTML, each variable and translation replaced by a placeholder."""
    out, skip_until = [], None
    for token in Lexer(source).tokenize():
        if token.token_type == TokenType.BLOCK:
            name = token.contents.split()[0] if token.contents else ""
            if skip_until is None and name in ("blocktranslate", "blocktrans", "comment"):
                skip_until = "end" + name
                out.append(TRANSLATED)
            elif skip_until is None and token.contents == "block bodyclass":
                skip_until = "endblock"  # CSS class names, not words
            elif name == skip_until:
                skip_until = None
            elif name in ("translate", "trans"):
                out.append(TRANSLATED)
        elif token.token_type == TokenType.VAR and not skip_until:
            out.append(TRANSLATED)
        elif token.token_type == TokenType.TEXT and not skip_until:
            out.append(token.contents)
    return "".join(out)


class _Reader(HTMLParser):
    """Collects the text and the read attributes that hold words."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self.hidden = 0  # inside <script> or <style>

    def _check(self, text: str) -> None:
        if [w for w in WORD.findall(text.replace(TRANSLATED, " ")) if w not in NAMES]:
            self.found.append(" ".join(text.replace(TRANSLATED, "…").split()))

    def handle_starttag(self, tag, attrs) -> None:
        attrs = dict(attrs)
        if tag in ("script", "style"):
            self.hidden += 1
        for name in READ_ATTRIBUTES:
            self._check(attrs.get(name) or "")
        if tag == "button" or (tag == "input" and attrs.get("type") in ("submit", "button")):
            self._check(attrs.get("value") or "")

    def handle_endtag(self, tag) -> None:
        if tag in ("script", "style"):
            self.hidden = max(0, self.hidden - 1)

    def handle_data(self, data) -> None:
        if not self.hidden:
            self._check(data)


def untranslated(source: str) -> list[str]:
    """The pieces of ``source`` a person would read in English whatever the language."""
    reader = _Reader()
    reader.feed(_flatten(source))
    reader.close()
    return reader.found


def test_the_checker_finds_english_outside_translate_tags():
    assert untranslated("<p>{% translate 'Steps' %}</p>") == []
    assert untranslated("{% blocktranslate %}Step {{ n }}{% endblocktranslate %}") == []
    assert untranslated("<h2>Steps</h2>") == ["Steps"]
    assert untranslated('<input type="submit" value="Retry">') == ["Retry"]
    assert untranslated('<a href="/x" class="button">{{ name }}</a> — #{{ pk }}') == []


@pytest.mark.parametrize("path", DESK_TEMPLATES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_desk_template_has_no_untranslated_text(path):
    found = untranslated(path.read_text())
    assert not found, f"{path.relative_to(ROOT)} shows English only: {found}"
