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
  a line nested more than :data:`MAX_DEPTH` levels deep (``too_deep``: every later step walks
  entries recursively, and Python's stack is finite) and a line holding a number beyond the
  range of a double (``bad_number``: ``JSON.parse`` reads ``1e400`` as ``Infinity``, which no
  token count can use and JSON cannot write back).
* The header's version decides migration. A version newer than :data:`CURRENT_VERSION`, or a
  header saying version 1 over entries that already have ids and parents, is a ``bad_header``
  problem: the entries are read as written (nothing migrated, no ids replaced) and the stores
  refuse every write (:attr:`ParsedSession.write_refusal`), because guessing would rewrite the
  file with new ids and flattened branches.
* An unterminated last line that is not JSON is a crash mid-append: ``torn_line``, and its bytes
  go to ``torn_tail`` so the file store can move them aside. An unterminated last line that *is*
  JSON is an ordinary line.
* After reading: a ``parentId`` that names no entry is ``unknown_parent`` and a parent chain that
  loops is ``cycle``. Those entries are kept, because pi keeps them (orphans are roots).

Unknown entry types and fields are not problems: they are kept verbatim (D2).
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from orchestrator._core.entries import CURRENT_VERSION, Entry
from orchestrator._core.migration import RandomHex, header_version, migrate, uuid_hex
from orchestrator._store.protocol import LoadResult, Problem


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


MAX_DEPTH = 200
"""Deepest nesting of arrays and objects a line may have (the line itself counts as 1).

pi's own entries nest about 6 deep; tool arguments add what the model sent. The limit leaves
room for the recursive walks later steps make (token estimates, serialization, the JSON
encoder) inside Python's default recursion limit of 1000 frames.
"""

BOM = b"\xef\xbb\xbf"


class _BadLine(ValueError):
    """A line that cannot be used, with the problem code and message that say why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _not_json() -> _BadLine:
    return _BadLine("not_json", "not valid JSON")


def _too_deep() -> _BadLine:
    return _BadLine(
        "too_deep", f"nested more than {MAX_DEPTH} levels deep, too deep to process; skipped"
    )


def _out_of_range(text: str) -> _BadLine:
    shown = text if len(text) <= 24 else f"{text[:12]}...{text[-6:]} ({len(text)} characters)"
    return _BadLine(
        "bad_number",
        f"the number {shown} is beyond the range of a double (JavaScript reads it as "
        "Infinity, which JSON cannot write back); skipped",
    )


def _reject_constant(name: str) -> Any:
    raise _not_json()


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _out_of_range(text)
    return value


def _parse_int(text: str) -> int:
    # 309 digits and more may exceed a double; float() of a long digit string never raises,
    # and past that range it says inf, before int() could hit its 4300-digit limit.
    if len(text) > 300 and math.isinf(float(text)):
        raise _out_of_range(text)
    return int(text)


# One decoder for every line: json.loads with a keyword builds a new decoder per call.
_DECODER = json.JSONDecoder(
    parse_constant=_reject_constant, parse_float=_parse_float, parse_int=_parse_int
)


def _decode(raw: bytes) -> Any:
    """Decode one line the way ``JSON.parse`` would, or raise :class:`_BadLine` saying why."""
    try:
        text = raw.decode("utf-8")
        value = _DECODER.decode(text)
    except _BadLine:
        raise
    except RecursionError:
        raise _too_deep() from None
    except ValueError:  # UnicodeDecodeError is a ValueError too
        raise _not_json() from None
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _depth(value) > MAX_DEPTH:
        raise _too_deep()
    return value


def _depth(value: object) -> int:
    """How deeply arrays and objects nest in ``value`` (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        children: Any = item.values() if isinstance(item, dict) else item
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children)
    return deepest


def _blank(raw: bytes) -> bool:
    return not raw or raw.isspace()


def _is_json(raw: bytes) -> bool:
    try:
        _decode(raw)
    except _BadLine as bad:
        return bad.code != "not_json"  # whole, just unusable: an ordinary line, not a torn one
    return True


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
    """Keep the cyclic garbage collector off while a file is parsed.

    Parsing allocates millions of dicts and lists that all survive and contain no cycles. With the
    collector on, each of those allocations counts toward a collection, and the full collections
    it triggers walk every object parsed so far: on a 1M-entry file they took most of the load
    time (issue 2's benchmark, tests/bench/bench_core.py). Reference counting still frees
    everything that dies here; the collector catches up once, in one pass, after it is back on.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def read_session(data: bytes, *, random_hex: RandomHex = uuid_hex) -> ParsedSession:
    """Like :func:`parse_session_bytes`, and also report the version stored in the file."""
    with gc_paused():
        return _read_session(data, random_hex=random_hex)


def _read_session(data: bytes, *, random_hex: RandomHex) -> ParsedSession:
    lines = data.split(b"\n")
    # The last element is what follows the final "\n": empty for a well-terminated file.
    unterminated = lines.pop()
    problems: list[Problem] = []
    torn = b""
    if not _blank(unterminated):
        if _is_json(unterminated):
            lines.append(unterminated)
        else:
            torn = unterminated
            problems.append(
                Problem(
                    line=len(lines) + 1,
                    code="torn_line",
                    message="the last line is incomplete (no newline and not JSON), "
                    "probably a write cut short by a crash",
                )
            )
    numbered = [(number, raw) for number, raw in enumerate(lines, start=1) if not _blank(raw)]
    if not numbered:
        result = LoadResult(header=None, problems=problems, torn_tail=torn)
        return ParsedSession(result=result, stored_version=None)
    header_line, header_raw = numbered[0]
    header = _header(header_raw)
    if isinstance(header, str):
        problem = Problem(line=header_line, code="not_session", message=header)
        result = LoadResult(header=None, problems=[problem, *problems], torn_tail=torn)
        return ParsedSession(result=result, stored_version=None)
    version = header_version(header)
    objects = _objects(numbered[1:], problems)
    version_problem = _version_problem(header, version, objects)
    if version_problem is not None:
        problems.append(Problem(line=header_line, code="bad_header", message=version_problem))
    refusal = None
    if version is not None and version < 2 and version_problem is None:
        kept = objects  # v1 entries have no ids yet; migration gives them ids and parents
    else:
        kept = _with_ids(objects, problems)
    if version_problem is not None and (version is None or version < CURRENT_VERSION):
        # Read as written: migrating entries that are not what the header says would replace
        # every id and flatten the branches.
        entries = [entry for _, entry in kept]
        migrated = False
    else:
        migration = migrate(header, [entry for _, entry in kept], random_hex=random_hex)
        header, entries, migrated = migration.header, list(migration.entries), migration.changed
    if version_problem is not None and version is not None:
        refusal = f"its header is wrong: {version_problem}"
    lined = list(zip((number for number, _ in kept), entries, strict=True))
    problems.extend(_link_problems(lined))
    problems.sort(key=lambda problem: problem.line)
    result = LoadResult(
        header=header, entries=entries, problems=problems, migrated=migrated, torn_tail=torn
    )
    return ParsedSession(result=result, stored_version=version, write_refusal=refusal)


def _header(raw: bytes) -> Entry | str:
    """The header object, or why the first line is not one."""
    if raw.startswith(BOM):
        return (
            "the file starts with a UTF-8 byte order mark (BOM), which session files never "
            "have and pi cannot read; remove the first 3 bytes to use it"
        )
    try:
        value = _decode(raw)
    except _BadLine as bad:
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


def _version_problem(
    header: Entry, version: int | None, objects: list[tuple[int, Entry]]
) -> str | None:
    """What is wrong with the header's version, or ``None`` when it can be acted on."""
    if version is None:
        return (
            f"the header's version {header.get('version')!r} is not a number; "
            "read as the current version, nothing migrated"
        )
    if version > CURRENT_VERSION:
        return (
            f"the header says version {version}, newer than this program reads "
            f"({CURRENT_VERSION}); read as version {CURRENT_VERSION}, nothing written"
        )
    if version < 2 and any(
        isinstance(entry.get("id"), str) and "parentId" in entry for _, entry in objects
    ):
        return (
            f"the header says version {version}, but the entries have ids and parents "
            "(version 2 or later); read as written, nothing migrated"
        )
    return None


def _objects(numbered: list[tuple[int, bytes]], problems: list[Problem]) -> list[tuple[int, Entry]]:
    objects: list[tuple[int, Entry]] = []
    for number, raw in numbered:
        try:
            value = _decode(raw)
        except _BadLine as bad:
            problems.append(Problem(line=number, code=bad.code, message=bad.message))
            continue
        if not isinstance(value, dict):
            message = f"a JSON {_json_kind(value)}, not an object; skipped"
            problems.append(Problem(line=number, code="not_object", message=message))
        elif value.get("type") == "session":
            message = "a second session header; skipped"
            problems.append(Problem(line=number, code="bad_header", message=message))
        else:
            objects.append((number, value))
    return objects


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "string" if isinstance(value, str) else "array"


def _with_ids(objects: list[tuple[int, Entry]], problems: list[Problem]) -> list[tuple[int, Entry]]:
    first_line: dict[str, int] = {}
    kept: list[tuple[int, Entry]] = []
    for number, entry in objects:
        entry_id = entry.get("id")
        if not isinstance(entry_id, str) or not entry_id:
            kind = entry.get("type")
            what = f"a {kind!r} entry" if isinstance(kind, str) else "an entry"
            message = f"{what} without an id; skipped"
            problems.append(Problem(line=number, code="no_id", message=message))
        elif entry_id in first_line:
            message = (
                f"entry id {entry_id!r} was already used on line {first_line[entry_id]}; "
                "this later entry is skipped"
            )
            problems.append(Problem(line=number, code="duplicate_id", message=message))
        else:
            first_line[entry_id] = number
            kept.append((number, entry))
    return kept


def _link_problems(lined: list[tuple[int, Entry]]) -> list[Problem]:
    """Report parents that do not exist and parent chains that loop."""
    line_of = {entry["id"]: number for number, entry in lined}
    parent_of: dict[str, str] = {}
    problems: list[Problem] = []
    for number, entry in lined:
        entry_id, parent = entry["id"], entry.get("parentId")
        if "parentId" not in entry:
            message = f"entry {entry_id!r} has no parentId field; kept as a root"
        elif parent is None or parent == entry_id:
            continue  # a root, as pi's getTree sees it
        elif isinstance(parent, str) and parent in line_of:
            parent_of[entry_id] = parent
            continue
        else:
            shown = repr(parent) if isinstance(parent, str) else f"{json.dumps(parent)} (not an id)"
            message = f"parent {shown} of entry {entry_id!r} does not exist; kept as a root"
        problems.append(Problem(line=number, code="unknown_parent", message=message))
    problems.extend(_cycles(parent_of, line_of))
    return problems


def _cycles(parent_of: dict[str, str], line_of: dict[str, int]) -> list[Problem]:
    # Each entry has at most one parent, so the graph is a functional graph: walking parents
    # from any entry either ends or enters exactly one cycle. Colouring makes it linear.
    done: set[str] = set()
    problems: list[Problem] = []
    for start in line_of:
        walk: list[str] = []
        on_walk: set[str] = set()
        node: str | None = start
        while node is not None and node not in done and node not in on_walk:
            walk.append(node)
            on_walk.add(node)
            node = parent_of.get(node)
        if node is not None and node in on_walk:
            members = walk[walk.index(node) :]
            first = min(members, key=line_of.__getitem__)
            # Name the members in chain order starting from the one earliest in the file.
            at = members.index(first)
            ordered = members[at:] + members[:at]
            chain = " -> ".join(repr(member) for member in [*ordered, first])
            message = f"entries form a parent cycle ({chain}); each has a parent but none is a root"
            problems.append(Problem(line=line_of[first], code="cycle", message=message))
        done.update(walk)
    return problems


def rewrite_refusal(location: str, parsed: ParsedSession) -> str | None:
    """Why a rewrite of this stored data must be refused, or ``None`` when it is safe (D3).

    A rewrite writes back only what loaded, so any skipped or suspicious line would be lost.
    A torn last line does not count: the stores move it aside before writing.
    """
    if parsed.write_refusal is not None:
        return f"refusing to rewrite {location}: {parsed.write_refusal}"
    damage = [problem for problem in parsed.result.problems if problem.code != "torn_line"]
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
    if _blank(tail) or _is_json(tail):
        return TailRepair(keep=len(data), moved=b"", add_newline=True)
    return TailRepair(keep=start, moved=tail, add_newline=False)
