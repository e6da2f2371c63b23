"""The façade: a sorted ``__all__`` of names that exist, and nothing private leaks."""

from __future__ import annotations

import subprocess
import sys

import orchestrator
import orchestrator.testing


def test_all_is_sorted_unique_and_importable() -> None:
    names = list(orchestrator.__all__)
    assert names == sorted(names, key=lambda n: (n[0].islower(), n))
    assert len(names) == len(set(names))
    for name in names:
        assert getattr(orchestrator, name) is not None
        assert not name.startswith("_")


def test_public_objects_come_from_private_modules() -> None:
    for name in orchestrator.__all__:
        module = getattr(getattr(orchestrator, name), "__module__", "orchestrator._x")
        assert module.startswith("orchestrator._"), (name, module)


def test_testing_exports_exist() -> None:
    for name in orchestrator.testing.__all__:
        assert hasattr(orchestrator.testing, name)


def test_import_is_quiet_and_lazy() -> None:
    # No network at import: litellm (and its cost-map download) loads only on a real call.
    code = "import sys, orchestrator, orchestrator.testing; print('litellm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert out.stderr == ""
