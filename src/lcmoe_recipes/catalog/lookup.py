"""Name lookup shared by the catalogues: key or alias, case-insensitive, with a 'did you mean' on a miss."""

from __future__ import annotations

import difflib
from typing import TypeVar

from ..errors import UnknownName

T = TypeVar("T")


def lookup(name: str, table: dict[str, T], aliases: dict[str, str], kind: str) -> T:
    """``table[aliases[normalised name]]``.

    Raises:
        UnknownName: "unknown {kind} 'x'", fix naming the closest spelling and every valid key.
    """
    key = aliases.get(name.strip().lower().replace(" ", "_"))
    if key is None:
        close = difflib.get_close_matches(name.strip().lower(), list(aliases), n=1)
        hint = f"did you mean '{aliases[close[0]]}'? " if close else ""
        raise UnknownName(f"unknown {kind} '{name}'", f"{hint}valid {kind}: {', '.join(table)}")
    return table[key]
