"""Locate the data folders ``machines/``, ``prompts/`` and the simulation ``scenarios/``.

In a wheel they live inside the package (hatchling rewrites their paths). An editable install
does not see them there, so I fall back to the checkout's folders (the scenarios live in
``traces/scenarios`` there, beside their recorded traces). Nothing else in the library reads
these folders directly.
"""

from __future__ import annotations

from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[2]
_IN_CHECKOUT = {"scenarios": Path("traces") / "scenarios"}


def data_dir(name: str) -> Path:
    """Return the folder holding the shipped data files called ``name``.

    Args:
        name: ``"machines"``, ``"prompts"`` or ``"scenarios"``.

    Returns:
        The packaged folder when it exists, else the checkout's top-level one.
    """
    # Here, not at the top: importlib.resources imports zipfile, tempfile and more, which a
    # command that reads no data folder should not pay for.
    from importlib import resources

    packaged = Path(str(resources.files("orchestrator"))) / name
    if packaged.is_dir():
        return packaged
    return _CHECKOUT / _IN_CHECKOUT.get(name, Path(name))
