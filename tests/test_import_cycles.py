"""No import cycles anywhere in the package (issue 7).

The layers contract (import-linter) keeps the subpackages in order; this test goes further and
fails on any cycle between two modules, inside a subpackage too. grimp (import-linter's engine)
builds the graph from the source, counting imports under ``TYPE_CHECKING`` and inside functions:
a module that needs another only "lazily" or "for types" still depends on it.
"""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest


def cycles(package: str) -> list[tuple[str, ...]]:
    """One import chain for each module that imports, directly, a module that imports it back."""
    graph = grimp.build_graph(package, cache_dir=None)
    found = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                found.append((module, *back))
    return found


def test_the_package_has_no_import_cycle() -> None:
    assert cycles("orchestrator") == []


def test_a_cycle_is_found_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "cyclic_example"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyclic_example import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cyclic_example import a\n"
    )
    (package / "c.py").write_text("from cyclic_example import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cycles("cyclic_example") == [
        ("cyclic_example.a", "cyclic_example.b", "cyclic_example.a"),
        ("cyclic_example.b", "cyclic_example.a", "cyclic_example.b"),
    ]
