"""Turn a session file's bytes into a header, entries and a list of problems (decision D3).

Both stores load through :func:`parse_session_bytes`, so the memory store is exactly as strict
(and as forgiving) as the file store. Everything here is pure: bytes in, records out.

Theory of operation. pi skips malformed lines silently and treats a file whose first object is
not a session header as empty, which it then overwrites. I keep pi's reading (the same lines
survive) but name every skipped or suspicious line with its 1-based line number, so a caller can
show the user what is wrong, and the stores refuse to overwrite a damaged file (see
:func:`rewrite_refusal`). What counts:

* The first non-blank line must be an object ``{"type": "session", "id": <string>}``; otherwise
  nothing loads and there is one ``not_session`` problem. (pi trims the file first, so leading
  blank lines do not move the header; blank lines anywhere are skipped silently, as in pi.)
  A file that starts with a UTF-8 byte order mark is ``not_session`` too, and the message says
  so: ``JSON.parse`` rejects the mark, so pi cannot read such a file either.
* A later line that is not JSON (``not_json``; also invalid UTF-8, and ``NaN``/``Infinity``,
  which JavaScript's ``JSON.parse`` rejects), not an object (``not_object``), has no string id
  (``no_id``; v1 files are exempt, their ids come from migration), repeats an earlier id
  (``duplicate_id``: the first wins), or is a second header (``bad_header``) is skipped. So is
  a line :mod:`~orchestrator._core.json_lines` refuses although it is JSON: nested too deep
  (``too_deep``) or holding a number beyond the range of a double (``bad_number``).
* The header's version decides migration. A version that is not a whole number (``3.5``,
  ``"99"``, ``true``), below 1 or newer than :data:`CURRENT_VERSION`, or a
  header saying version 1 over entries that already have ids and parents, is a ``bad_header``
  problem: the entries are read as written (nothing migrated, no ids replaced) and the stores
  refuse every write (:attr:`ParsedSession.write_refusal`), because guessing would rewrite the
  file with new ids and flattened branches.
* An unterminated last line that is not JSON is a crash mid-append: ``torn_line``, and its bytes
  go to ``torn_tail`` so the file store can move them aside. An unterminated last line that *is*
  JSON is an ordinary line.
* After reading: a ``parentId`` that names no entry is ``unknown_parent`` and a parent chain that
  loops is ``cycle``. Those entries are kept, because pi keeps them (orphans are roots).
  A usage count that is a number but not a count (negative, or past a double's range) is
  ``bad_usage`` (:mod:`~orchestrator._core.usage_check`): kept, counted as 0. A compaction whose
  ``firstKeptEntryId`` is not on its path (its own id is pi 1.x's retain-none, valid) is
  ``kept_off_path``, and a context edit whose ``targetId`` is not is ``edit_target_off_path``
  (:mod:`~orchestrator._core.reference_check`): kept as written.

Unknown entry types and fields are not problems: they are kept verbatim (D2).
"""

from __future__ import annotations

import gc
import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from orchestrator._core.entries import CURRENT_VERSION, Entry
from orchestrator._core.json_lines import BadLine, is_json, line_decoder
from orchestrator._core.load_result import EntryIndex, LoadResult, Problem
from orchestrator._core.migration import RandomHex, header_version, migrate, uuid_hex
from orchestrator._core.reading import (
    SHARE_FROM_BYTES,
    link_problems,
    read_entries,
    sharing_words,
    with_usable_ids,
)
from orchestrator._core.reference_check import reference_problems
from orchestrator._core.usage_check import usage_problems


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedSession:
    """A load result plus what the stores need to decide whether writing is safe.

    Attributes:
        result: What the caller gets from ``load()``.
        stored_version: The version written in the file (1 for v1), ``None`` with no header.
        write_refusal: Why no write of any kind may touch this data (a header version this
            program must not act on), else ``None``.
    """

    result: LoadResult
    stored_version: int | None
    write_refusal: str | None = None


BOM = b"\xef\xbb\xbf"


def _blank(raw: bytes) -> bool:
    return not raw or raw.isspace()


def parse_session_bytes(data: bytes, *, random_hex: RandomHex = uuid_hex) -> LoadResult:
    """Parse a whole session file. Never raises on damaged data.

    Args:
        data: The file's bytes.
        random_hex: Randomness for the ids a v1 migration assigns.

    Returns:
        The usable header and entries (migrated to version 3) and every problem, in line order.
    """
    return read_session(data, random_hex=random_hex).result


@contextmanager
def gc_paused() -> Iterator[None]:
    """Keep the cyclic garbage collector off while a file is parsed and indexed.

    Parsing allocates millions of dicts and lists that all survive and contain no cycles. With
    the collector on, every 700 allocations start a young collection, and the full collections
    that follow walk every object parsed so far: on a 1M-entry file they took most of the load
    time (tests/bench/bench_core.py). Reference counting still frees everything that dies here.

    When the collector comes back on, the loaded objects would sit in the youngest generation,
    and the next two collections would walk all of them only to promote them step by step to the
    oldest one. I promote them at once instead: ``gc.freeze()`` followed by ``gc.unfreeze()``
    moves every tracked object into the oldest generation without examining any (two list
    splices). Nothing stays frozen, so objects the caller owns are collected as before, and the
    loaded objects are examined by full collections only, whose cost CPython already amortizes
    over the growth of the heap: loading stays linear, collection included. If the caller keeps
    objects frozen itself (``gc.freeze()`` before forking workers, say), I leave the generations
    alone, because ``unfreeze`` would thaw the caller's objects too. Before a load that will
    promote, the young generations are collected, so that no cyclic garbage of the caller's is
    promoted with the parsed objects (it would wait for a full collection). A long-running
    process that holds a large session for good can do better still: ``gc.collect()`` then
    ``gc.freeze()`` right after opening it keeps the session out of every later collection
    (and, since it collected first, freezes no garbage).
    """
    was_enabled = gc.isenabled()
    # get_freeze_count() walks the frozen objects: ask it only when nobody said.
    promote = was_enabled and not FREEZING[0] and gc.get_freeze_count() == 0
    if promote:
        # The promotion moves what is young now too, garbage included: a cycle dropped just
        # before would then wait for a full collection, which the uncounted promotion can put
        # off indefinitely. The young generations are small by construction: collect them.
        gc.collect(1)
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if promote and gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            elif FREEZING[0]:
                # The server's policy (gc_policy.py) freezes what survives a full collection;
                # a session loaded while it is installed is frozen at once instead, without the
                # full collection that would walk it (a second of every thread stopped, for
                # 200,000 entries: the server loads in a worker thread, issue 35). Cyclic
                # garbage made meanwhile is frozen with it, until a session closes (unfreeze).
                gc.freeze()
            gc.enable()


FREEZING = [False]
"""Set by a process-wide policy that keeps objects frozen (``orchestrator serve``'s, issue 9):
then :func:`gc_paused` leaves the generations alone without asking ``gc.get_freeze_count()``,
which costs a walk of every frozen object (a thousand open sessions made each load seconds)."""


def read_session(data: bytes, *, random_hex: RandomHex = uuid_hex) -> ParsedSession:
    """Like :func:`parse_session_bytes`, and also report the version stored in the file."""
    pieces = [data] if len(data) <= _BATCH else _pieces(data)
    return read_session_chunks(pieces, size=len(data), random_hex=random_hex)


def read_session_chunks(
    chunks: Iterable[bytes],
    *,
    size: int,
    random_hex: RandomHex = uuid_hex,
    outline: bool = False,
    taken: Callable[[Entry], Entry] | None = None,
) -> ParsedSession:
    """Parse a session file handed over in pieces, as :func:`read_session` parses it whole.

    A store reads a big file a chunk at a time into this, so the file is never in memory whole:
    holding it meant a fresh page per 4 KB read, each a page fault, which on a virtual machine
    costs microseconds (610 MB at 1M entries; issue 9). A chunk's lines die with it, and the
    next chunk takes their memory back.

    Args:
        chunks: The file's bytes in order, in pieces of any sizes (empty ones allowed).
        size: The file's size as far as the caller knows it: it picks the line decoder only.
        random_hex: Randomness for the ids a v1 migration assigns.
        outline: Keep of each entry only its place in the tree and its references
            (:func:`~orchestrator._core.reading.outline_of`), for a reader that wants the
            problems and the tree's shape only (``check``); the problems are the same. A file
            that migrates is read whole (migration rewrites what the entries hold).
        taken: With ``outline``, makes each outline from the whole entry as it is read
            (:func:`~orchestrator._core.reading.read_entries`); never called for a file that
            migrates, which is not outlined.
    """
    with gc_paused():
        return _read_session(
            _Lines(chunks), size, random_hex=random_hex, outline=outline, taken=taken
        )


_BATCH = 1 << 16
"""Bytes of an in-memory file handed to the parser at a time: it is not split whole into lines."""


def _pieces(data: bytes) -> Iterator[bytes]:
    for start in range(0, len(data), _BATCH):
        yield data[start : start + _BATCH]


class _Lines:
    """The lines of a file given in chunks, a batch per chunk, and what its end turned out to be.

    :attr:`batches` yields ``(index, lines)``: the 0-based index of the batch's first line and the
    complete lines the chunk ended (a line can straddle any number of chunks). What follows the
    last newline is only known once the chunks run out: a JSON value is yielded as a last line,
    anything else that is not blank is kept as :attr:`torn` (a write cut short by a crash), on
    line :attr:`torn_line`.
    """

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.torn = b""
        self.torn_line = 0
        self.batches = self._split(chunks)

    def _split(self, chunks: Iterable[bytes]) -> Iterator[tuple[int, list[bytes]]]:
        pending: list[bytes] = []  # the start of a line that has not ended yet
        index = 0
        for chunk in chunks:
            lines = chunk.split(b"\n")
            if len(lines) == 1:
                pending.append(chunk)
                continue
            if pending:
                pending.append(lines[0])
                lines[0] = b"".join(pending)
            pending = [lines.pop()]
            yield index, lines
            index += len(lines)
        unterminated = b"".join(pending)
        if _blank(unterminated):
            return
        if is_json(unterminated):
            yield index, [unterminated]
        else:
            self.torn, self.torn_line = unterminated, index + 1

    def finish(self) -> list[Problem]:
        """Read the lines nobody asked for, and say whether the end was torn."""
        for _ in self.batches:
            pass
        if not self.torn:
            return []
        return [
            Problem(
                line=self.torn_line,
                code="torn_line",
                message="the last line is incomplete (no newline and not JSON), "
                "probably a write cut short by a crash",
            )
        ]


def _read_session(
    lines: _Lines,
    size: int,
    *,
    random_hex: RandomHex,
    outline: bool = False,
    taken: Callable[[Entry], Entry] | None = None,
) -> ParsedSession:
    batches = lines.batches
    found = _first_line(batches)
    if found is None:
        result = LoadResult(header=None, problems=lines.finish(), torn_tail=lines.torn)
        return ParsedSession(result=result, stored_version=None)
    first, rest = found
    decode = line_decoder(size)
    header = _header(rest[0][1][0], decode)
    if isinstance(header, str):
        problem = Problem(line=first + 1, code="not_session", message=header)
        result = LoadResult(header=None, problems=[problem, *lines.finish()], torn_tail=lines.torn)
        return ParsedSession(result=result, stored_version=None)
    version = header_version(header)
    # v1 entries have no ids yet (migration gives them ids and parents); others are checked
    # for a usable, unique id as they are decoded.
    with_ids = version is None or version >= 2
    rest[0] = (first + 1, rest[0][1][1:])
    problems: list[Problem] = []
    whole = not outline or version != CURRENT_VERSION
    read = read_entries(
        itertools.chain(rest, batches),
        problems,
        sharing_words(decode) if whole and size >= SHARE_FROM_BYTES else decode,
        with_ids=with_ids,
        outline=outline and version == CURRENT_VERSION,
        taken=taken if outline and version == CURRENT_VERSION else None,
    )
    entries, numbers, line_of = read.entries, read.numbers, read.line_of
    del rest, batches  # the raw bytes of the lines: let them go before the index is built
    problems.extend(lines.finish())
    torn = lines.torn
    version_problem = _version_problem(header, version, entries)
    if version_problem is not None:
        problems.append(Problem(line=first + 1, code="bad_header", message=version_problem))
    # Any version this program cannot name exactly refuses every write (3.5, "99", true, 0):
    # what is written after it would claim a version nobody chose.
    refusal = f"its header is wrong: {version_problem}" if version_problem else None
    migrated = False
    if version is not None and version < 2 and version_problem is None:
        # v1 entries have no ids yet; migration gives them ids and parents.
        migration = migrate(header, entries, random_hex=random_hex)
        header, entries, migrated = migration.header, list(migration.entries), True
        line_of = {entry["id"]: number for entry, number in zip(entries, numbers, strict=True)}
    else:
        if not with_ids:  # a v1 header over entries with ids: read them as they are
            entries, numbers, line_of = with_usable_ids(entries, numbers, problems)
        # Read as written when the version is wrong: migrating entries that are not what the
        # header says would replace every id and flatten the branches.
        if version_problem is None and version is not None and version < CURRENT_VERSION:
            migration = migrate(header, entries, random_hex=random_hex)
            header, entries, migrated = migration.header, list(migration.entries), True
    index = None
    if with_ids and not migrated:
        # The pass that read the lines noted the links to check and the usage problems, and
        # indexed the entries by id: the entries are those it read, as it read them.
        problems.extend(link_problems(entries, numbers, line_of, read.irregular))
        problems.extend(read.usage_problems)
        index = EntryIndex(by_id=read.by_id, linear=read.linear())
    else:
        problems.extend(link_problems(entries, numbers, line_of))
        problems.extend(usage_problems(entries, numbers))
    problems.extend(reference_problems(entries, numbers, line_of))
    problems.sort(key=lambda problem: problem.line)
    result = LoadResult(
        header=header,
        entries=entries,
        problems=problems,
        migrated=migrated,
        torn_tail=torn,
        index=index,
    )
    return ParsedSession(result=result, stored_version=version, write_refusal=refusal)


def _first_line(
    batches: Iterator[tuple[int, list[bytes]]],
) -> tuple[int, list[tuple[int, list[bytes]]]] | None:
    """The index of the first line that is not blank, and its batch from that line on."""
    for index, lines in batches:
        for offset, raw in enumerate(lines):
            if not _blank(raw):
                return index + offset, [(index + offset, lines[offset:])]
    return None


def _header(raw: bytes, decode: Callable[[bytes], Any]) -> Entry | str:
    """The header object, or why the first line is not one."""
    if raw.startswith(BOM):
        return (
            "the file starts with a UTF-8 byte order mark (BOM), which session files never "
            "have and pi cannot read; remove the first 3 bytes to use it"
        )
    try:
        value = decode(raw)
    except BadLine as bad:
        if bad.code != "not_json":
            return f"the first line cannot be used ({bad.message.removesuffix('; skipped')})"
        value = None
    if isinstance(value, dict) and value.get("type") == "session":
        if isinstance(value.get("id"), str):
            return value
    return (
        'the first line is not a session header ({"type": "session", "id": ...}), '
        "so this is not a session file"
    )


def _version_problem(header: Entry, version: int | None, entries: list[Entry]) -> str | None:
    """What is wrong with the header's version, or ``None`` when it can be acted on."""
    if version is None:
        return (
            f"the header's version {_what_version(header.get('version'))}; "
            f"read as version {CURRENT_VERSION}, nothing written"
        )
    if version < 1:
        return (
            f"the header says version {version}, but versions are 1 to {CURRENT_VERSION}; "
            "read as written, nothing written"
        )
    if version > CURRENT_VERSION:
        return (
            f"the header says version {version}, newer than this program reads "
            f"({CURRENT_VERSION}); read as version {CURRENT_VERSION}, nothing written"
        )
    if version < 2 and any(
        isinstance(entry.get("id"), str) and "parentId" in entry for entry in entries
    ):
        return (
            f"the header says version {version}, but the entries have ids and parents "
            "(version 2 or later); read as written, nothing migrated"
        )
    return None


def _what_version(value: object) -> str:
    """What an unreadable version is, shown as the file writes it: ``"99" is a string, ...``."""
    shown = json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return f"{shown} is a boolean, not a version number (1 to {CURRENT_VERSION})"
    if isinstance(value, str):
        return f"{shown} is a string, not a version number (1 to {CURRENT_VERSION})"
    if isinstance(value, float):
        return f"{shown} is not a whole number"
    return f"{shown} is not a number"


# Problems whose entry loaded: a rewrite writes it back as it was, so nothing is lost.
_WRITTEN_BACK = frozenset({"torn_line", "bad_usage", "kept_off_path", "edit_target_off_path"})


def rewrite_refusal(location: str, parsed: ParsedSession) -> str | None:
    """Why a rewrite of this stored data must be refused, or ``None`` when it is safe (D3).

    A rewrite writes back only what loaded, so any skipped or suspicious line would be lost.
    A torn last line does not count: the stores move it aside before writing. Nor does a bad
    usage count or a reference off the path: the entry loaded, and is written back as it was.
    """
    if parsed.write_refusal is not None:
        return f"refusing to rewrite {location}: {parsed.write_refusal}"
    damage = [p for p in parsed.result.problems if p.code not in _WRITTEN_BACK]
    if not damage:
        return None
    listed = "; ".join(str(problem) for problem in damage[:5])
    more = f" (and {len(damage) - 5} more)" if len(damage) > 5 else ""
    return (
        f"refusing to rewrite {location}: it has problems a rewrite would erase: {listed}{more}. "
        "Repair or move the file first; appending is still possible"
    )


def append_refusal(location: str, parsed: ParsedSession, entries: Sequence[Entry]) -> str | None:
    """Why appending ``entries`` to this stored data must be refused, or ``None`` (D3)."""
    codes = {problem.code for problem in parsed.result.problems}
    if parsed.write_refusal is not None:
        return f"refusing to append to {location}: {parsed.write_refusal}"
    if "not_session" in codes:
        return f"refusing to append to {location}: it is not a session file (no session header)"
    if parsed.result.header is None:
        if not entries or entries[0].get("type") != "session":
            return (
                f"refusing to append to {location}: the file has no session header yet, "
                "so the first entry appended must be the header"
            )
    elif parsed.stored_version is not None and parsed.stored_version < 2:
        return (
            f"refusing to append to {location}: it is a version 1 file whose ids exist only in "
            "memory after migration; rewrite it first"
        )
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class TailRepair:
    """How to make a file end on a clean line before appending to it.

    Attributes:
        keep: Bytes of the file to keep (the rest is cut off).
        moved: The cut-off bytes of a torn last line, to be kept in a side file.
        add_newline: The last line is whole but lacks its newline; add one instead of cutting.
    """

    keep: int
    moved: bytes
    add_newline: bool


def plan_tail_repair(data: bytes) -> TailRepair | None:
    """Decide how to repair the end of a file, or ``None`` when it already ends cleanly.

    An unterminated last line that is JSON (or blank) only lacks its newline; anything else is
    a torn line, which must go before an append, or the new line would be glued onto it.
    """
    if not data or data.endswith(b"\n"):
        return None
    start = data.rfind(b"\n") + 1
    tail = data[start:]
    if _blank(tail) or is_json(tail):
        return TailRepair(keep=len(data), moved=b"", add_newline=True)
    return TailRepair(keep=start, moved=tail, add_newline=False)
