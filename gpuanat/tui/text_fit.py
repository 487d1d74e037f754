"""Text cut to the room it has, never mid-word: what a narrow layout drops says so with "…" after a whole word, and
a parenthesis goes whole before the words around it do."""

from __future__ import annotations

import re

PARENTHESIS = re.compile(r"\s*\([^()]*\)")


def fit_words(text: str, room: int) -> str:
    """`text` if it fits `room` cells; else without its parenthetical remarks if that fits; else cut after the last
    whole word that leaves room for "…" ("" when not even one word fits)."""
    if len(text) <= room:
        return text
    plain = PARENTHESIS.sub("", text)
    if len(plain) <= room:
        return plain
    cut = plain[: max(0, room - 1)]
    if len(plain) > len(cut) and not plain[len(cut)].isspace():  # cut inside a word: back to its start
        cut = cut.rsplit(" ", 1)[0] if " " in cut else ""
    cut = cut.rstrip(" ,;:·—-(")
    return f"{cut}…" if cut else ""
