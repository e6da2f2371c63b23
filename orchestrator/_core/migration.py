"""Bring a stored session up to version 3 (pi's migration, decision D1).

pi migrates in place and then rewrites the file. I keep the two apart: :func:`migrate` is a pure
function that returns new dicts (entries are never mutated, see :mod:`orchestrator._core.entries`),
and whoever owns the store decides whether to write the result back. Loading never writes (D3).

The steps are pi's:

* v1 → v2: every entry, in file order, gets a fresh 8-hex id and ``parentId`` = the previous
  entry's id (the first gets ``null``). A compaction's numeric ``firstKeptEntryIndex`` (an index
  into the file's array of entries *including* the header at index 0) becomes
  ``firstKeptEntryId``, and the index field is deleted.
* v2 → v3: ``message`` entries whose ``message.role`` is ``"hookMessage"`` get role ``"custom"``.
* A header with version 3 or more is left alone, so migrating twice changes nothing.

Two places where I do better than pi on purpose, both invisible on well-formed files:

* pi's v1 id generator checks collisions against a set it never fills; I add each new id to the
  set, so a migrated v1 file cannot get two entries with the same id.
* pi converts ``firstKeptEntryIndex`` while it is still assigning ids, so an index pointing
  forward would read an id that does not exist yet. I assign every id first, then convert.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator._core.entries import COMPACTION, CURRENT_VERSION, MESSAGE, Entry, new_entry_id

RandomHex = Callable[[], str]
"""A source of random hex strings (at least 8 characters), injectable for tests."""


def uuid_hex() -> str:
    """32 random hex characters (pi takes ids from ``randomUUID()`` the same way)."""
    import uuid  # here, not at the top: reading a v3 session never needs it

    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True, kw_only=True)
class Migration:
    """The result of :func:`migrate`.

    Attributes:
        header: The header, with ``version`` set to 3 when anything ran.
        entries: The entries in file order (the same dict objects where nothing changed).
        from_version: The version the data had before (1 when the header had none).
        changed: True when a migration step ran.
    """

    header: Entry
    entries: tuple[Entry, ...]
    from_version: int
    changed: bool


def header_version(header: Entry) -> int | None:
    """The session version a header declares: 1 when absent, ``None`` when unreadable.

    pi reads ``header.version ?? 1``. A whole-number float (``3.0``) counts as that number; a
    boolean, string or fraction is unreadable, and the caller decides what that means.
    """
    if "version" not in header or header["version"] is None:
        return 1
    value = header["version"]
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def migrate(
    header: Entry, entries: Sequence[Entry], *, random_hex: RandomHex = uuid_hex
) -> Migration:
    """Migrate a header and its entries to version 3, without mutating anything.

    Args:
        header: The ``session`` header as read.
        entries: The entries in file order (header excluded).
        random_hex: Source of random hex for the ids v1 entries receive.

    Returns:
        The migrated data. An unreadable ``version`` is treated as current (nothing runs),
        because guessing an older version would replace every id in the file.
    """
    version = header_version(header)
    if version is None or version >= CURRENT_VERSION:
        return Migration(
            header=header,
            entries=tuple(entries),
            from_version=version if version is not None else CURRENT_VERSION,
            changed=False,
        )
    migrated = list(entries)
    if version < 2:
        migrated = _v1_to_v2(migrated, random_hex)
    migrated = [_v2_to_v3(entry) for entry in migrated]
    return Migration(
        header={**header, "version": CURRENT_VERSION},
        entries=tuple(migrated),
        from_version=version,
        changed=True,
    )


def _v1_to_v2(entries: list[Entry], random_hex: RandomHex) -> list[Entry]:
    used: set[str] = set()
    linked: list[Entry] = []
    previous: str | None = None
    for entry in entries:
        entry_id = new_entry_id(used, random_hex)
        used.add(entry_id)
        linked.append({**entry, "id": entry_id, "parentId": previous})
        previous = entry_id
    return [_index_to_id(entry, linked) for entry in linked]


def _index_to_id(entry: Entry, linked: list[Entry]) -> Entry:
    if entry.get("type") != COMPACTION or "firstKeptEntryIndex" not in entry:
        return entry
    index = entry["firstKeptEntryIndex"]
    converted = {key: value for key, value in entry.items() if key != "firstKeptEntryIndex"}
    if isinstance(index, bool) or not isinstance(index, int | float):
        # pi only converts (and deletes) a numeric index; anything else stays as it was.
        return entry
    # Index 0 is the header, which pi refuses as a target; so is anything outside the array.
    if float(index).is_integer() and 1 <= index <= len(linked):
        converted["firstKeptEntryId"] = linked[int(index) - 1]["id"]
    return converted


def _v2_to_v3(entry: Entry) -> Entry:
    message = entry.get("message")
    if entry.get("type") != MESSAGE or not isinstance(message, dict):
        return entry
    if message.get("role") != "hookMessage":
        return entry
    return {**entry, "message": {**message, "role": "custom"}}
