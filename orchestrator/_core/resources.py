"""Locate the data folders ``machines/`` and ``prompts/``.

In a wheel they live inside the package (hatchling rewrites their paths). An editable install
does not see them there, so I fall back to the checkout's top-level folders. Nothing else in the
library reads these folders directly.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[2]


def data_dir(name: str) -> Path:
    """Return the folder holding the shipped data files called ``name``.

    Args:
        name: ``"machines"`` or ``"prompts"``.

    Returns:
        The packaged folder when it exists, else the checkout's top-level one.
    """
    packaged = Path(str(resources.files("orchestrator"))) / name
    if packaged.is_dir():
        return packaged
    return _CHECKOUT / name
