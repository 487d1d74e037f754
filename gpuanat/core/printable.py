"""The one rule for strings from outside: shown, they are data — never escape sequences, never markup.

Process names and command lines (any local user sets their own), run names, model paths, config values, a
child's log lines, error messages and publication fields reach gpuanat's views and outputs. `printable` is
the one place that decides how such a string reads: every character a terminal could act on, or that hides
or reorders text, is written out visibly as Python writes it in a `repr` (`\\x1b`, `\\n`, `\\u202e`), the way
`ls -b` and `git` show hostile file names; bytes that were not UTF-8 (decoded with `surrogateescape`, as
Python decodes argv, /proc and file names) read as the byte (`\\xff`). Everything else is kept as given, so
a plain name reads as itself and the escaping costs a check of the string.

Markup is the views' half of the rule: a string is shown as text (`rich.text.Text`, `markup=False`), never
parsed. JSON keeps the exact string (its encoder escapes controls); the stored value stays what the user gave.
"""

from __future__ import annotations

import re

SHORT_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
"""The three controls Python's repr writes short; every other is written by its code point."""

SGR = re.compile(r"\x1b\[[0-9;:]*m")
"""A colour or text-style sequence (Select Graphic Rendition): the one escape a log line may keep, and only
where it is turned into styles by a parser (Rich's `Text.from_ansi`), never written to a terminal raw."""

SURROGATE_ESCAPES = range(0xDC80, 0xDD00)
"""Where `surrogateescape` puts a byte that was not UTF-8 (U+DC80 + the byte's value above 0x7f)."""


def _escaped(character: str) -> str:
    if character in SHORT_ESCAPES:
        return SHORT_ESCAPES[character]
    code = ord(character)
    if code in SURROGATE_ESCAPES:
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: object, *, keep: str = "") -> str:
    """`text` (or `str(text)`) as it may be shown: C0 and C1 controls, DEL, bidi overrides and other invisible
    format characters, separators other than the space, and undecodable bytes visibly escaped. `keep` names
    controls to leave as they are where the output's own layout uses them (newlines of a multi-line message)."""
    text = text if isinstance(text, str) else str(text)
    if text.isprintable():
        return text
    return "".join(
        character if character.isprintable() or character in keep else _escaped(character) for character in text
    )


def printable_keeping_colours(line: str) -> str:
    """A log line for a view that turns colour sequences into styles: `printable` everywhere but in its SGR
    sequences (the only escapes kept; cursor moves, titles, clipboard writes, hyperlinks are escaped) and its tabs
    (the view expands them, as a terminal would)."""
    parts: list[str] = []
    shown_from = 0
    for match in SGR.finditer(line):
        parts.append(printable(line[shown_from : match.start()], keep="\t"))
        parts.append(match.group())
        shown_from = match.end()
    parts.append(printable(line[shown_from:], keep="\t"))
    return "".join(parts)
