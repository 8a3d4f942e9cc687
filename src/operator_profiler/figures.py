"""Printing figures next to a threshold (no torch, no pandas): used by the optimizer's texts and the optimize
page alike."""

from __future__ import annotations


def apart(x: float, pivot: float = 1.0, digits: int = 3, scale: float = 1.0, most: int = 9) -> str:
    """``x * scale`` with ``digits`` decimals, or with more (up to ``most``) when ``x`` differs from ``pivot`` and
    would print as ``pivot`` would: a bound 1.00003 prints 1.00003, not 1.000, so an interval above 1 never reads
    as reaching 1 (likewise 0.99997 below it). Exactly ``pivot`` prints with ``digits``."""
    while True:
        text = f"{x * scale:.{digits}f}"
        if x == pivot or digits >= most or text != f"{pivot * scale:.{digits}f}":
            return text
        digits += 1


def interval(value: float | None, ci: list | None, unit: str = "", digits: int = 3) -> str:
    """``1.234x [1.100, 1.300]`` (``unit`` after the value); each figure through :func:`apart`, so a bound on the
    other side of 1 never prints as 1. ``""`` for no value; the bracket only with both bounds known."""
    if value is None:
        return ""
    text = f"{apart(value, digits=digits)}{unit}"
    if ci and None not in ci:
        text += f" [{apart(ci[0], digits=digits)}, {apart(ci[1], digits=digits)}]"
    return text
