"""The session tree: entries indexed by id, parent links, labels and the active leaf.

Sans-I/O: this module never touches a file or a clock. Callers pass ``now_ms`` and an id source
when they create entries. The tree follows pi's ``SessionManager`` semantics:

* every append is a child of the current leaf and becomes the new leaf;
* a root is an entry whose ``parentId`` is null, its own id, or an id that does not exist;
* ``path()`` walks parent links from the leaf to a root and returns it root-first.

The path of the current leaf is cached and extended on append, so asking for the active path after
appending one entry costs O(1), not a walk of the whole branch (the benchmark measures it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from orchestrator._core.entries import LABEL, SESSION_INFO, Entry, iso_now, new_entry_id
from orchestrator._core.errors import EntryNotFoundError, SessionError
from orchestrator._core.load_result import EntryIndex

LEAF: object = object()
"""Default ``parent_id`` of :meth:`SessionTree.new_entry`: the current leaf."""


@dataclass(slots=True)
class TreeNode:
    """One node of :meth:`SessionTree.nodes`: an entry, its children, and its label."""

    entry: Entry
    children: list[TreeNode] = field(default_factory=list)
    label: str | None = None


class SessionTree:
    """An in-memory index over a session's entries (the header is kept beside it).

    Args:
        header: The ``session`` header object.
        entries: Entries in file order. They are indexed, not copied.
    """

    def __init__(
        self, header: Entry, entries: list[Entry] | None = None, index: EntryIndex | None = None
    ) -> None:
        self.header = header
        self.entries: list[Entry] = []
        self.by_id: dict[str, Entry] = {}
        self._children: dict[str | None, list[str]] | None = None
        self._labels: dict[str, str] | None = None
        self.leaf_id: str | None = None
        self._path: list[Entry] = []
        self._path_leaf: str | None = None
        # Every entry's parent is the entry before it in the file, the first is a root, and no
        # id repeats: the path to the last entry is then every entry (the usual pi session).
        self._linear = True
        if index is not None and entries:
            # The loader's line pass indexed them while each was fresh (loading.py): taken over.
            self.entries.extend(entries)
            self.by_id, self._linear = index.by_id, index.linear
        else:
            self._index_all(entries or [])
        self.leaf_id = self.entries[-1]["id"] if self.entries else None

    def snapshot(self) -> SessionTree:
        """A copy that appends to this tree leave unchanged, for work in another thread.

        Entries are shared, not copied: an entry is never changed once in a tree (a change is
        a new entry). The index is copied (a few milliseconds for 200,000 entries), so the
        copy can be walked while this tree grows.
        """
        copy = SessionTree(
            self.header, list(self.entries), EntryIndex(by_id=dict(self.by_id), linear=self._linear)
        )
        copy.leaf_id = self.leaf_id
        copy._labels = dict(self._labels) if self._labels is not None else None
        return copy

    # -- indexing ----------------------------------------------------------------------------

    def _index(self, entry: Entry) -> None:
        entry_id = entry["id"]
        if self._linear:
            self._linear = entry_id not in self.by_id and self._follows(entry, self.entries)
        self.entries.append(entry)
        self.by_id[entry_id] = entry
        if self._children is not None:
            self._children.setdefault(self._parent_key(entry), []).append(entry_id)
        if self._labels is not None and entry.get("type") == LABEL:
            self._label(self._labels, entry)

    def _index_all(self, entries: list[Entry]) -> None:
        # _index, unrolled for loading: one loop, locals instead of attribute lookups.
        linear = self._linear and (not entries or self._follows(entries[0], self.entries))
        self.entries.extend(entries)
        by_id = self.by_id
        known = len(by_id)
        previous = None
        for entry in entries:
            entry_id = entry["id"]
            if linear and previous is not None and entry.get("parentId") != previous:
                linear = False
            previous = entry_id
            by_id[entry_id] = entry
        self._linear = linear and len(by_id) == known + len(entries)
        self._labels = None  # read again on first use

    @property
    def labels(self) -> dict[str, str]:
        """Each labelled entry's label (the latest ``label`` entry naming it wins; empty: none).

        Read from the entries at first use and kept up to date after: opening a session and
        building its context never need them.
        """
        if self._labels is None:
            labels: dict[str, str] = {}
            for entry in self.entries:
                if entry.get("type") == LABEL:
                    self._label(labels, entry)
            self._labels = labels
        return self._labels

    @staticmethod
    def _follows(entry: Entry, before: list[Entry]) -> bool:
        """Whether ``entry`` keeps a linear tree linear after ``before``."""
        parent = entry.get("parentId")
        if not before:  # a root, as parent_of sees one
            return not isinstance(parent, str) or parent == entry["id"]
        return bool(parent == before[-1]["id"])

    @property
    def children(self) -> dict[str | None, list[str]]:
        """The ids of each entry's children in file order (key ``None``: the roots).

        Built at first use and kept up to date after. Opening a session and building its
        context never need it, and on a big file it was a list per entry: 100 bytes each, a
        fifth of the load's dictionary work and more objects for every collection (issue 9).
        """
        if self._children is None:
            children: dict[str | None, list[str]] = {}
            for entry in self.entries:
                entry_id = entry["id"]
                parent = entry.get("parentId")
                key = parent if isinstance(parent, str) and parent != entry_id else None
                siblings = children.get(key)
                if siblings is None:
                    children[key] = [entry_id]
                else:
                    siblings.append(entry_id)
            self._children = children
        return self._children

    @staticmethod
    def _label(labels: dict[str, str], entry: Entry) -> None:
        target, label = entry.get("targetId"), entry.get("label")
        if isinstance(target, str):
            if isinstance(label, str) and label:
                labels[target] = label
            else:
                labels.pop(target, None)

    def _parent_key(self, entry: Entry) -> str | None:
        parent = entry.get("parentId")
        if not isinstance(parent, str) or parent == entry["id"]:
            return None
        return parent

    # -- reading -----------------------------------------------------------------------------

    @property
    def linear(self) -> bool:
        """Whether the tree is one chain in file order (the usual pi session).

        The first entry is a root, every other the child of the one before it, and no id
        appears twice: no branch and no cycle, so :meth:`nodes` is that chain.
        """
        return self._linear

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self.by_id

    def get(self, entry_id: str) -> Entry:
        """Return the entry with this id.

        Raises:
            SessionError: ``Entry <id> not found``.
        """
        try:
            return self.by_id[entry_id]
        except KeyError:
            raise EntryNotFoundError(entry_id) from None

    def parent_of(self, entry: Entry) -> Entry | None:
        """The parent entry, or ``None`` for a root (including an orphan)."""
        key = self._parent_key(entry)
        return self.by_id.get(key) if key is not None else None

    def path(self, leaf_id: str | None = None) -> list[Entry]:
        """Entries from a root down to ``leaf_id`` (default: the active leaf), root first.

        A missing parent ends the walk (an orphan chain gives a partial path), and so does a
        cycle, which the loader reports; the walk never loops.

        Raises:
            SessionError: when ``leaf_id`` is given and unknown.
        """
        if leaf_id is None:
            leaf_id = self.leaf_id
            if leaf_id is None:
                return []
            if self._path_leaf == leaf_id:
                return list(self._path)
            path = self._walk(leaf_id)
            self._path, self._path_leaf = path, leaf_id
            return list(path)
        self.get(leaf_id)
        return self._walk(leaf_id)

    def _walk(self, leaf_id: str) -> list[Entry]:
        # The parent links, inlined (no set of the ids seen): a walk longer than the file has
        # entries has met a cycle, and only then is it walked again, guarded, to end where the
        # loop closes (the loader reports the cycle).
        # Most parents are the entry just before in the file (pi appends a child after its
        # parent): the walk checks that entry first, by position, and looks the id up only when
        # it is not (a lookup in a dictionary of every id is a cache miss per entry).
        by_id, entries = self.by_id, self.entries
        limit = len(entries)
        if self._linear and entries and entries[-1]["id"] == leaf_id:
            return list(entries)
        at = limit - 1 if entries and entries[-1]["id"] == leaf_id else -1
        path: list[Entry] = []
        entry: Entry | None = by_id.get(leaf_id)
        while entry is not None:
            path.append(entry)
            parent = entry.get("parentId")
            if not isinstance(parent, str) or parent == entry["id"]:
                break
            if at > 0 and entries[at - 1]["id"] == parent:
                at -= 1
                entry = entries[at]
            else:
                at = -1
                entry = by_id.get(parent)
            if len(path) > limit:
                return self._walk_guarded(leaf_id)
        path.reverse()
        return path

    def _walk_guarded(self, leaf_id: str) -> list[Entry]:
        path: list[Entry] = []
        seen: set[str] = set()
        entry: Entry | None = self.by_id.get(leaf_id)
        while entry is not None and entry["id"] not in seen:
            seen.add(entry["id"])
            path.append(entry)
            entry = self.parent_of(entry)
        path.reverse()
        return path

    def children_of(self, entry_id: str | None) -> list[Entry]:
        """Children of an entry (``None``: the roots), oldest timestamp first."""
        if entry_id is None:
            return self.roots()
        kids = [self.by_id[i] for i in self.children.get(entry_id, ())]
        return sorted(kids, key=lambda e: str(e.get("timestamp", "")))

    def roots(self) -> list[Entry]:
        """Entries without a (known) parent, oldest timestamp first."""
        roots = [e for e in self.entries if self.parent_of(e) is None]
        return sorted(roots, key=lambda e: str(e.get("timestamp", "")))

    def nodes(self) -> list[TreeNode]:
        """The whole tree as nested nodes (pi ``getTree``), children by timestamp."""
        built: dict[str, TreeNode] = {
            e["id"]: TreeNode(entry=e, label=self.labels.get(e["id"])) for e in self.entries
        }
        breakers = self._cycle_breakers()
        roots: list[TreeNode] = []
        for entry in self.entries:
            node = built[entry["id"]]
            parent = self.parent_of(entry)
            if parent is None or entry["id"] in breakers:
                roots.append(node)
            else:
                built[parent["id"]].children.append(node)
        key: Callable[[TreeNode], str] = lambda n: str(n.entry.get("timestamp", ""))  # noqa: E731
        for node in built.values():
            node.children.sort(key=key)
        roots.sort(key=key)
        return roots

    def _cycle_breakers(self) -> set[str]:
        # Entries on a parent cycle are reachable from no root. The loader reports the cycle;
        # here the first member in file order becomes a root so the whole tree stays visible
        # and walking it never loops.
        reached: set[str] = set()
        breakers: set[str] = set()

        def mark(start: str) -> None:
            stack = [start]
            while stack:
                current = stack.pop()
                if current not in reached:
                    reached.add(current)
                    stack.extend(self.children.get(current, ()))

        for root in self.roots():
            mark(root["id"])
        for entry in self.entries:
            if entry["id"] not in reached:
                breakers.add(entry["id"])
                mark(entry["id"])
        return breakers

    def iter_depth_first(self) -> Iterator[tuple[int, TreeNode]]:
        """Walk :meth:`nodes` depth-first, yielding ``(depth, node)``."""
        stack = [(0, n) for n in reversed(self.nodes())]
        while stack:
            depth, node = stack.pop()
            yield depth, node
            stack.extend((depth + 1, c) for c in reversed(node.children))

    def session_name(self) -> str | None:
        """The latest non-empty ``session_info`` name (pi), or else the header's title (OMP)."""
        for entry in reversed(self.entries):
            if entry.get("type") == SESSION_INFO:
                name = entry.get("name")
                if isinstance(name, str) and name.strip():
                    return name.strip()
        title = self.header.get("title")
        return title if isinstance(title, str) and title else None

    # -- changing ----------------------------------------------------------------------------

    def new_entry(
        self,
        kind: str,
        fields: dict[str, Any],
        *,
        now_ms: int,
        random_hex: Callable[[], str] | None = None,
        parent_id: str | None | object = LEAF,
    ) -> Entry:
        """Build (but do not append) an entry of ``kind`` as a child of the leaf.

        Args:
            kind: The entry ``type``.
            fields: The type's own fields.
            now_ms: Creation time, epoch ms.
            random_hex: Id randomness; the default is ``uuid4``.
            parent_id: The parent id, ``None`` for a new root; by default (:data:`LEAF`) the
                current leaf.

        Returns:
            The entry, with ``id``, ``parentId`` and ``timestamp`` set.
        """
        new_id = new_entry_id(self.by_id, random_hex) if random_hex else new_entry_id(self.by_id)
        parent = self.leaf_id if parent_id is LEAF else parent_id
        entry: Entry = {
            "type": kind,
            "id": new_id,
            "parentId": parent,
            "timestamp": iso_now(now_ms),
        }
        entry.update(fields)
        return entry

    def append(self, entry: Entry) -> None:
        """Add an entry and make it the leaf.

        Raises:
            SessionError: when the id is already used.
        """
        if entry.get("id") in self.by_id:
            raise SessionError(f"Entry id {entry.get('id')} is already in the session")
        extends_cache = self._path_leaf is not None and self._path_leaf == self.leaf_id
        self._index(entry)
        if extends_cache and self._parent_key(entry) == self._path_leaf:
            self._path.append(entry)
            self._path_leaf = entry["id"]
        self.leaf_id = entry["id"]

    def replace(self, entry: Entry) -> None:
        """Swap an entry for a new version with the same id and parent (used by pruning)."""
        old = self.get(entry["id"])
        if old.get("parentId") != entry.get("parentId"):
            raise SessionError(f"Entry {entry['id']}: a replacement must keep its parentId")
        self.by_id[entry["id"]] = entry
        self.entries[self.entries.index(old)] = entry
        self._path_leaf = None

    def branch(self, entry_id: str) -> None:
        """Move the leaf to an existing entry (the next append becomes its child).

        Raises:
            SessionError: ``Entry <id> not found``.
        """
        self.get(entry_id)
        self.leaf_id = entry_id

    def reset_leaf(self) -> None:
        """Set the leaf to nothing: the next append becomes a new root."""
        self.leaf_id = None
