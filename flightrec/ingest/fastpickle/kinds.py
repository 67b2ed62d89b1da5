"""The kinds of object the walker records, one small int each (a tape's `kind` column)."""

from __future__ import annotations

NONE, INT, FLOAT, STR, BOOL, LIST, DICT, TUPLE = range(8)
