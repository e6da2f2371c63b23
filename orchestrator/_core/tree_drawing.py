"""The connectors that show a session tree's branches: ``├─``, ``└─`` and ``│``.

``tree`` and the navigator's picker drew each branch point's children at the same indent with
nothing between them, so a fork read as one long chain. I draw the tree as pi's ``/tree`` does:
a chain (one child after another) stays at its indent, and where an entry has several children
each child starts with ``├─`` (``└─`` for the last), its descendants continuing under a ``│``
(nothing under the last one). Several roots are drawn as the children of one invisible root.

This is pure: it takes the rows in depth-first order as (id, parent id) pairs and returns a
prefix per row. A parent that is not among the rows (a hidden entry's, say) must be replaced by
the nearest ancestor that is, or ``None``, before calling.
"""

from __future__ import annotations

from collections.abc import Sequence

BRANCH = "├─ "
LAST = "└─ "
THROUGH = "│  "
PAST = "   "


def tree_prefixes(rows: Sequence[tuple[str, str | None]]) -> list[str]:
    """The prefix that draws each row's place in the tree.

    Args:
        rows: ``(id, parent id)`` in depth-first order, parents before their children; a
            parent id not among the rows counts as ``None`` (a root).

    Returns:
        One prefix per row, in order: the continuation lines of the branches it is under, then
        its own connector when its parent has more than one child.
    """
    ids = {entry_id for entry_id, _ in rows}
    parents = [parent if parent in ids else None for _, parent in rows]
    children: dict[str | None, list[str]] = {}
    for (entry_id, _), parent in zip(rows, parents, strict=True):
        children.setdefault(parent, []).append(entry_id)
    # What the descendants of each entry are drawn under (None: the invisible root).
    under: dict[str | None, str] = {None: ""}
    prefixes = []
    for (entry_id, _), parent in zip(rows, parents, strict=True):
        siblings = children[parent]
        above = under.get(parent, "")
        if len(siblings) == 1:
            prefixes.append(above)
            under[entry_id] = above
        else:
            last = siblings[-1] == entry_id
            prefixes.append(above + (LAST if last else BRANCH))
            under[entry_id] = above + (PAST if last else THROUGH)
    return prefixes
