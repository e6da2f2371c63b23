"""The checks a session's public calls make on their arguments before anything runs."""

from __future__ import annotations

from orchestrator._core.errors import SessionError
from orchestrator._store.session import Session


def require_text(call: str, name: str, value: object, *, optional: bool = False) -> None:
    """Refuse a text argument that is not a ``str`` before anything runs or is written.

    An id or a label of another type would be written into the session, where pi reads a
    string (a ``label`` entry of 5), or looked up and reported as a missing entry ("Entry None
    not found"), which hides the caller's mistake.

    Raises:
        TypeError: ``value`` is not a ``str`` (nor ``None``, when ``optional``).
    """
    if isinstance(value, str) or (optional and value is None):
        return
    wanted = "a str or None" if optional else "a str"
    raise TypeError(f"{call}() takes {name} as {wanted}, not {type(value).__name__}")


def require_writable(session: Session) -> None:
    """Refuse before a summary is paid for when the file refuses every append.

    A file whose header or side file refuses every append is known as such from its reading:
    say so now, not after the model answered (the commit would refuse).

    Raises:
        SessionError: what the reading found.
    """
    refusal = session.known_refusal()
    if refusal is not None:
        raise SessionError(refusal)


def require_open(session: Session, *, closed: bool) -> None:
    """Refuse any call once the session is closed.

    Closed, the session's lock is released: a call now would write to a file another process
    may own, and take the lock again with nothing left to release it (D27).

    Raises:
        SessionError: the session is closed.
    """
    if closed:
        raise SessionError(
            f"{session.store.location}: the session is closed; open it again to use it"
        )


def require_prompt(text: object, *, agent: object) -> None:
    """Refuse a prompt that is not a ``str``, or one to a session with no agent to answer it.

    Raises:
        TypeError: ``text`` is not a string (nothing is written).
        SessionError: no agent was given.
    """
    if not isinstance(text, str):
        # Written to the session as the user's message, where pi reads a string.
        raise TypeError(f"prompt() takes the user's text, a str, not {type(text).__name__}")
    if agent is None:
        raise SessionError("this session has no agent; pass agent= to AgentSession")


def require_navigation(target_id: object, instructions: object, label: object) -> None:
    """Refuse a navigation's arguments of the wrong type.

    Raises:
        TypeError: an argument of the wrong type (nothing runs).
    """
    require_text("navigate", "target_id", target_id)
    require_text("navigate", "instructions", instructions, optional=True)
    require_text("navigate", "label", label, optional=True)
