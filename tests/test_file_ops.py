"""File-operation tracking (as pi tracks them)."""

from __future__ import annotations

from orchestrator._core.file_ops import (
    FileOperations,
    compute_file_lists,
    file_ops_from_details,
    file_ops_of_messages,
    js_sorted,
)
from tests.sessions import SessionBuilder


def _assistant(*calls: tuple[str, dict[str, object]]) -> dict[str, object]:
    s = SessionBuilder()
    entry_id = s.assistant("", calls=calls)
    message: dict[str, object] = s[entry_id]["message"]
    return message


def test_read_write_edit_calls_are_tracked() -> None:
    ops = file_ops_of_messages(
        [
            _assistant(("read", {"path": "a.py"}), ("write", {"path": "b.py", "content": "x"})),
            _assistant(("edit", {"path": "c.py", "oldText": "1", "newText": "2"})),
        ]
    )
    assert ops == FileOperations(
        read=frozenset({"a.py"}), written=frozenset({"b.py"}), edited=frozenset({"c.py"})
    )


def test_other_tools_bad_paths_and_other_roles_are_ignored() -> None:
    s = SessionBuilder()
    s.user([{"type": "text", "text": "read a.py"}])
    ops = file_ops_of_messages(
        [
            s.path()[0]["message"],
            _assistant(("bash", {"path": "x"}), ("read", {"path": ""}), ("read", {"path": 3})),
            _assistant(("read", {})),
            {"role": "assistant", "content": "plain text"},
            {"role": "assistant", "content": [{"type": "toolCall", "name": "read"}]},
            {"role": "toolResult", "toolName": "read", "content": [{"type": "text", "text": "a"}]},
        ]
    )
    assert ops == FileOperations()


def test_seed_is_extended() -> None:
    seed = FileOperations(read=frozenset({"old.py"}))
    ops = file_ops_of_messages([_assistant(("read", {"path": "new.py"}))], seed)
    assert ops.read == {"old.py", "new.py"}


def test_details_seed_unless_from_extension() -> None:
    details = {"readFiles": ["r.py", 4], "modifiedFiles": ["m.py"]}
    pi_made = {"type": "compaction", "details": details}
    assert file_ops_from_details(pi_made) == FileOperations(
        read=frozenset({"r.py"}), edited=frozenset({"m.py"})
    )
    assert file_ops_from_details({**pi_made, "fromExtension": True}) == FileOperations()
    assert file_ops_from_details({**pi_made, "fromHook": True}) == FileOperations()
    assert file_ops_from_details({"type": "compaction"}) == FileOperations()
    assert (
        file_ops_from_details({"type": "compaction", "details": {"readFiles": "r.py"}})
        == FileOperations()
    )


def test_read_files_exclude_modified_and_both_sorted() -> None:
    ops = FileOperations(
        read=frozenset({"z.py", "a.py", "b.py"}),
        written=frozenset({"b.py", "y.py"}),
        edited=frozenset({"c.py"}),
    )
    assert compute_file_lists(ops) == (("a.py", "z.py"), ("b.py", "c.py", "y.py"))


def test_sort_is_javascript_utf16_order() -> None:
    # U+1F600 is a surrogate pair (D83D DE00) in UTF-16, so JS sorts it before U+FF5E.
    emoji, fullwidth = "\U0001f600", "\uff5e"
    assert sorted([fullwidth, emoji]) == [fullwidth, emoji]  # Python: code points
    assert js_sorted([fullwidth, emoji]) == (emoji, fullwidth)  # JavaScript: code units
