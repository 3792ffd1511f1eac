"""The desk's template tags (``{% load desk %}``)."""

from __future__ import annotations

from functools import lru_cache

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import get_language
from django.utils.translation import gettext as _

register = template.Library()


@lru_cache(maxsize=16)
def _copy_words(language: str | None) -> tuple[str, str, str]:
    # Translated once per language: a ledger table shows a key on each of its rows.
    return _("Copied"), _("Copy the full key: %(key)s"), _("Copy")


@register.simple_tag
def copyable_key(key) -> SafeString:
    """A long key (an operation key, a fingerprint) shortened to fit a table, whole in its
    title and on a button that copies it (``govflow/copy.js``)."""
    key = "" if key is None else str(key)
    if key.isascii():  # cut as ``truncatechars:17`` cuts it, without its Unicode counting
        short = key if len(key) <= 17 else key[:16] + "…"
    else:
        short = Truncator(key).chars(17)
    code = format_html('<code class="govflow-key" title="{}">{}</code>', key, short)
    if not key:
        return code
    copied, title, copy = _copy_words(get_language())
    return format_html(
        '{} <button type="button" class="govflow-copy button" data-copy="{}" data-done="{}" '
        'title="{}">{}</button>',
        code,
        key,
        copied,
        title % {"key": key},
        copy,
    )
