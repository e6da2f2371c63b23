r"""Text read from a file, made safe to show in a one-line message.

A lock file, a journal or a database row is written by whoever can write there; its text
reaches the terminal in notes, warnings and errors. A newline in it would split a one-line
message in two (and fake a second line), an escape sequence would drive the terminal, and a
lone surrogate would make printing it raise. So every character Python does not call printable
is shown as its escape, as ``repr`` writes it (``\n``, ``\x1b``, ``\u200b``, ``\ud800``);
everything else, a space and any letter of any script included, is shown as it is.
"""

from __future__ import annotations


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
