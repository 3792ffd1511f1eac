"""Numbers from the environment, read with a message that says what is wrong.

``int(os.environ[...])`` on a value such as ``30s`` stops the start-up with a bare
``ValueError`` traceback that names neither the variable nor what it should hold. These
readers name both, and keep the development default when the variable is unset or empty.
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured


def _number(name: str, default: float, kind: type, what: str) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not {what}. Set it to {what} (for example {default!r}) "
            "or unset it to use that default; see docs/deployment.md."
        ) from None


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    """The whole number in ``name``, or ``default`` when it is unset or empty; below
    ``minimum`` it is refused."""
    value = int(_number(name, default, int, "a whole number"))
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(
            f"{name}={value} is below {minimum}. Set it to a whole number of at least "
            f"{minimum} (for example {default}) or unset it to use that default; see "
            "docs/deployment.md."
        )
    return value


def env_float(name: str, default: float) -> float:
    """The number in ``name`` (decimals allowed), or ``default`` when unset or empty."""
    return float(_number(name, default, float, "a number"))
