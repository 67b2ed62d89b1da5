"""Lists in user text: the first few items, and how many in all when some are left out."""

from __future__ import annotations

from collections.abc import Iterable


def listed(items: Iterable[object], limit: int = 3, sep: str = ", ") -> str:
    """'a, b, c' or 'a, b, c, ... (7 in all)': a list cut short says so."""
    items = [str(x) for x in items]
    if len(items) <= limit:
        return sep.join(items)
    return sep.join(items[:limit]) + f"{sep}... ({len(items):,} in all)"
