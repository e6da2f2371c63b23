r"""Text read from a file, made safe to show in a one-line message.

A lock file, a journal or a database row is written by whoever can write there; its text
reaches the terminal in notes, warnings and errors. A newline in it would split a one-line
message in two (and fake a second line), an escape sequence would drive the terminal, and a
lone surrogate would make printing it raise. So every character Python does not call printable
is shown as its escape, as ``repr`` writes it (``\n``, ``\x1b``, ``\u200b``, ``\ud800``);
everything else, a space and any letter of any script included, is shown as it is.
"""

from __future__ import annotations

import re

_TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""What drives a terminal: C0 controls but tab and newline, DEL, and the C1 controls."""


def printable(text: str) -> str:
    """``text`` in one line that prints as it reads: non-printable characters escaped.

    Control, format, separator (other than space), surrogate and unassigned characters are
    escaped as ``repr`` escapes them.

    Returns:
        ``text`` itself when it is already printable.
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def terminal_safe(text: str) -> str:
    r"""``text`` with every character that would drive a terminal shown as its ``\u`` escape.

    For what a command prints (a tree's previews, a context, a summary): a session's text is
    written by whoever wrote its tool results, and tool output holds colour codes and worse (a
    ``\x1b]0;...`` retitles the terminal, ``\x1b[2J`` clears it). Tab and newline stay, so
    lines and columns are as they were; the escape is JSON's own form (``\u001b``), so a line
    of JSON that held such a character raw (JSON leaves DEL and C1 controls raw) still parses
    to the same value.
    """
    if _TERMINAL_CONTROLS.search(text) is None:
        return text
    return _TERMINAL_CONTROLS.sub(lambda found: f"\\u{ord(found.group()):04x}", text)
