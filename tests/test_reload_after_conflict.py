"""After another program wrote to an owned session, the session is read again (D27).

A conditional commit that meets another writer's change applies nothing (``ConflictError``). The
runtime then reloads the session (:meth:`Session.reload`), so that asking again works from what
is there now: an append, a rewrite by rename (a new file behind the open writer), and a file
that is gone or no longer a session, which leaves the session as it was and writes nothing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from orchestrator._core.errors import ConflictError, SessionError
from orchestrator._store.session import Session
from tests.cli_kit import EXAMPLE, pi_user_line

foreign = pi_user_line


@pytest.fixture
def owned(tmp_path: Path) -> tuple[Path, Session]:
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    session = Session.open(path, owner="test")
    session.open_writer()  # as a runtime holds it: the file open for appending
    return path, session


def test_an_append_by_another_program_is_read_in(owned: tuple[Path, Session]) -> None:
    path, session = owned
    try:
        expect, leaf = session.tail(), session.leaf_id
        assert leaf is not None
        with path.open("ab") as file:
            file.write(foreign(leaf))
        entry = session.new_entry("custom", {"customType": "mine", "data": None})
        with pytest.raises(ConflictError):
            session.add_entry(entry, expect=expect)
        session.reload()
        assert session.leaf_id == "c0ffee01"
        assert session.context().entry_ids[-1] == "c0ffee01"
        again = session.new_entry("custom", {"customType": "mine", "data": None})
        session.add_entry(again, expect=session.tail())
        session.flush()
    finally:
        session.close()
    reread = Session.open(path)
    assert reread.leaf_id == again["id"]
    assert reread.tree.get(again["id"])["parentId"] == "c0ffee01"


def test_a_file_replaced_behind_the_writer_is_the_one_written_after(
    owned: tuple[Path, Session],
) -> None:
    path, session = owned
    try:
        leaf = session.leaf_id
        assert leaf is not None
        replacement = path.with_name("new.jsonl")
        replacement.write_bytes(path.read_bytes() + foreign(leaf))
        os.replace(replacement, path)  # a rewrite by rename: a new inode
        with pytest.raises(ConflictError, match="replaced"):
            session.add_entry(
                session.new_entry("custom", {"customType": "mine"}), expect=session.tail()
            )
        session.reload()
        entry = session.new_entry("custom", {"customType": "mine", "data": None})
        session.add_entry(entry, expect=session.tail())
        session.flush()
    finally:
        session.close()
    assert Session.open(path).leaf_id == entry["id"]


def test_a_session_that_is_gone_is_left_as_it_was_and_nothing_is_created(
    owned: tuple[Path, Session],
) -> None:
    path, session = owned
    try:
        entries = list(session.tree.entries)
        path.unlink()
        with pytest.raises(SessionError, match="gone"):
            session.reload()
        assert list(session.tree.entries) == entries
        assert not path.exists()
        path.write_bytes(b"not a session\n")
        with pytest.raises(SessionError, match="not a session file"):
            session.reload()
        assert list(session.tree.entries) == entries
        assert path.read_bytes() == b"not a session\n"
    finally:
        session.close()
    assert path.read_bytes() == b"not a session\n"
