"""Which files a stretch of conversation read and changed (as pi tracks file operations, D16).

Summaries end with the files the summarized work read and modified, so the agent does not have
to rediscover them. The lists are cumulative: a compaction starts from the lists its predecessor
stored in ``details`` and adds what the newly summarized messages did. Lists written by an
extension are not trusted as seeds, because an extension may store anything in ``details``.

Only the ``read``, ``write`` and ``edit`` tools are understood, through the ``path`` argument of
the assistant's tool call; the tool result is not consulted (a failed read still counts, as in pi).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator._core.entries import is_from_extension


@dataclass(frozen=True, slots=True, kw_only=True)
class FileOperations:
    """Files touched by tool calls, by kind of operation.

    Attributes:
        read: Paths passed to ``read``.
        written: Paths passed to ``write``.
        edited: Paths passed to ``edit`` (and seeded ``modifiedFiles``).
    """

    read: frozenset[str] = field(default_factory=frozenset)
    written: frozenset[str] = field(default_factory=frozenset)
    edited: frozenset[str] = field(default_factory=frozenset)

    def union(self, other: FileOperations) -> FileOperations:
        """Both sets of operations together."""
        return FileOperations(
            read=self.read | other.read,
            written=self.written | other.written,
            edited=self.edited | other.edited,
        )


def _tool_calls(message: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    content = message.get("content")
    if message.get("role") != "assistant" or not isinstance(content, list):
        return ()
    return (b for b in content if isinstance(b, dict) and b.get("type") == "toolCall")


def file_ops_of_messages(
    messages: Iterable[Mapping[str, Any]], seed: FileOperations | None = None
) -> FileOperations:
    """Add the file operations of assistant tool calls in ``messages`` to ``seed``.

    Args:
        messages: Context messages; only assistant ``toolCall`` blocks are read.
        seed: Operations to start from (default: none).

    Returns:
        The accumulated operations.
    """
    buckets: dict[str, set[str]] = {"read": set(), "write": set(), "edit": set()}
    for message in messages:
        for call in _tool_calls(message):
            arguments = call.get("arguments")
            path = arguments.get("path") if isinstance(arguments, dict) else None
            bucket = buckets.get(str(call.get("name")))
            if bucket is not None and isinstance(path, str) and path:
                bucket.add(path)
    found = FileOperations(
        read=frozenset(buckets["read"]),
        written=frozenset(buckets["write"]),
        edited=frozenset(buckets["edit"]),
    )
    return found if seed is None else seed.union(found)


def file_ops_from_details(entry: Mapping[str, Any]) -> FileOperations:
    """Seed operations from a compaction's or branch summary's ``details``.

    Extension-made entries and entries without ``details`` seed nothing. ``readFiles`` seeds
    ``read`` and ``modifiedFiles`` seeds ``edited`` (pi).
    """
    details = entry.get("details")
    if is_from_extension(entry) or not isinstance(details, dict):
        return FileOperations()
    return FileOperations(
        read=frozenset(_strings(details.get("readFiles"))),
        edited=frozenset(_strings(details.get("modifiedFiles"))),
    )


def _strings(value: object) -> Iterable[str]:
    if not isinstance(value, list):
        return ()
    return (v for v in value if isinstance(v, str) and v)


def js_sorted(values: Iterable[str]) -> tuple[str, ...]:
    """Sort strings as JavaScript's default ``Array.prototype.sort`` does (UTF-16 code units).

    Python compares code points, which differs from JavaScript for characters outside the BMP
    (surrogate pairs sort below U+E000..U+FFFF in UTF-16).
    """
    listed = list(values)
    # The usual paths are ASCII: both orders agree, no key needed (checked in one C call).
    if "".join(listed).isascii():
        return tuple(sorted(listed))
    return tuple(sorted(listed, key=lambda s: s.encode("utf-16-be", "surrogatepass")))


def compute_file_lists(ops: FileOperations) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The ``(read_files, modified_files)`` lists of a summary (pi's rule).

    ``modified_files`` is written ∪ edited; ``read_files`` is read minus modified. Both sorted in
    JavaScript order so that our ``details`` match pi's byte for byte.
    """
    modified = ops.written | ops.edited
    return js_sorted(ops.read - modified), js_sorted(modified)
